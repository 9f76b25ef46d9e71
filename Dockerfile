# The image the Helm chart runs: `setu` with its PostgreSQL and Spark extras, Java 17 for the
# Spark ingest job, and Spark's Kafka connector jars and the job's own operator in SETU_CACHE_DIR
# (fetched with Maven and built at build time, so pods never download or compile anything).
#
#   docker build -t setu:0.1.0 .
#   scripts/build-image                 # the same with buildah, on a base made from Debian's packages
#
# BASE is any Debian bookworm image with Python 3.11 and its venv module: the registry's
# python:3.11-slim-bookworm by default, or the one `scripts/build-image` makes with mmdebstrap.
# Every process is `setu <command>` (the chart sets the command per Deployment); user 10001
# matches the chart's podSecurityContext, and nothing writes outside /var/lib/setu and /tmp, so
# the root filesystem can be read-only (the chart mounts both as volumes).
ARG BASE=python:3.11-slim-bookworm

FROM ${BASE} AS build
ARG DEBIAN_FRONTEND=noninteractive
# A build behind a TLS-intercepting proxy passes the proxy's CA as the secret `build-ca` (PEM,
# one or more certificates; scripts/build-image passes this machine's locally added CAs). This
# stage trusts it for apt, pip and Maven; the final stage never sees it.
# The JDK builds the ingest job's de-duplication operator (`setu fetch`, cli/jvm.py).
RUN --mount=type=secret,id=build-ca \
    if [ -s /run/secrets/build-ca ]; then \
      mkdir -p /usr/local/share/ca-certificates \
      && awk '/BEGIN CERTIFICATE/ {n++} {print > ("/usr/local/share/ca-certificates/build-ca-" n ".crt")}' \
           /run/secrets/build-ca; \
    fi \
 && apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates openjdk-17-jdk-headless maven \
 && update-ca-certificates \
 && rm -rf /var/lib/apt/lists/*
ENV VIRTUAL_ENV=/opt/setu/venv \
    PATH=/opt/setu/venv/bin:$PATH \
    SETU_CACHE_DIR=/opt/setu/cache \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt
RUN python3 -m venv "$VIRTUAL_ENV"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY setu/ setu/
COPY api/ api/
COPY delivery/ delivery/
COPY spark/ spark/
COPY state/ state/
COPY cli/ cli/
COPY migrations/ migrations/
RUN pip install --no-cache-dir ".[postgres,spark]" \
 && setu fetch --spark-only

FROM ${BASE}
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --uid 10001 --user-group --home-dir /var/lib/setu --create-home setu
COPY --from=build /opt/setu /opt/setu
ENV PATH=/opt/setu/venv/bin:$PATH \
    SETU_CACHE_DIR=/opt/setu/cache \
    SETU_DATA_DIR=/var/lib/setu \
    SETU_API_HOST=0.0.0.0 \
    PYTHONUNBUFFERED=1
USER 10001
WORKDIR /var/lib/setu
EXPOSE 8080
ENTRYPOINT ["setu"]
CMD ["api"]
