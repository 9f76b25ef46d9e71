# The image the Helm chart runs: `setu` with its PostgreSQL and Spark extras, Java 17 for the
# Spark ingest job, and Spark's Kafka connector jars and the job's own operator in SETU_CACHE_DIR
# (fetched with Maven and built at build time, so pods never download or compile anything).
#
#   docker build -t setu:0.1.0 .
#
# Every process is `setu <command>` (the chart sets the command per Deployment); user 10001
# matches the chart's podSecurityContext.

FROM python:3.11-slim-bookworm AS build
# The JDK builds the ingest job's de-duplication operator (`setu fetch`, cli/jvm.py).
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jdk-headless maven \
 && rm -rf /var/lib/apt/lists/*
ENV VIRTUAL_ENV=/opt/setu/venv \
    PATH=/opt/setu/venv/bin:$PATH \
    SETU_CACHE_DIR=/opt/setu/cache
RUN python -m venv "$VIRTUAL_ENV"
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

FROM python:3.11-slim-bookworm
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
