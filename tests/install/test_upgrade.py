"""``helm upgrade`` from the previous release while producers and deliveries go on: the new
chart's migration Job migrates the database under the old pods (and changes nothing when run
again), the ingest job is replaced, and the API and worker pods are replaced one at a time,
an old API pod and a new one serving producers side by side; nothing is lost, reordered or
repeated."""

from __future__ import annotations

import uuid

import sqlalchemy as sa

from tests.install.kube import Cluster, Pod, render
from tests.install.support import (
    API,
    DELIVERY,
    INGEST,
    MIGRATE,
    READY_TIMEOUT_S,
    RELEASE,
    Load,
    Release,
    assert_delivered_in_order,
    chart_values,
    install,
    quickstart,
    roll,
    show_logs,
)
from tests.integration.delivery.support import Receiver
from tests.waiting import wait_for


def schema_revision(database: str) -> str:
    engine = sa.create_engine(database)
    try:
        with engine.connect() as conn:
            return str(conn.exec_driver_sql("select version_num from alembic_version").scalar())
    finally:
        engine.dispose()


def test_an_upgrade_from_the_previous_release_under_load_loses_nothing(
    previous_release: Release,
    image: str,
    helm: str,
    services_host: str,
    kafka_bootstrap: str,
    redis_url: str,
    database: str,
    webhook: Receiver,
) -> None:
    # Given the previous release installed, with a producer and deliveries going
    services = (kafka_bootstrap, redis_url, database)
    old_values = chart_values(previous_release.image, *services)
    cluster = Cluster(render(helm, old_values, RELEASE, previous_release.chart))
    try:
        installed = install(cluster)
        old_schema = schema_revision(database)
        project = f"upgrade{uuid.uuid4().hex[:6]}"
        load = Load(
            lambda: list(installed.apis), project, quickstart(installed, webhook, project, "load")
        )
        load.start()
        wait_for("first deliveries", lambda: len(webhook.delivered()) >= 20, 120)

        # When the release is upgraded with the same values and the new image
        cluster.upgrade(render(helm, chart_values(image, *services), RELEASE))
        # the pre-upgrade hook migrates the database while the old pods serve (twice: a hook
        # that failed half-way is retried)
        cluster.create_secrets(hooks=True)
        cluster.run_job(MIGRATE, timeout_s=READY_TIMEOUT_S)
        new_schema = schema_revision(database)
        cluster.run_job(MIGRATE, timeout_s=READY_TIMEOUT_S)
        assert schema_revision(database) == new_schema != old_schema
        cluster.create_secrets(hooks=False)
        # the ingest job is recreated (one query per checkpoint); the previous release's may
        # need its grace period, and be killed at its end, as Kubernetes would
        installed.ingest.stop()
        old_ingest_exit = installed.ingest.exit_code()
        installed.ingest = cluster.replica(INGEST)
        # and the API and workers roll, an old and a new API pod taking producers side by side
        side_by_side: list[tuple[str, int, str, int]] = []

        def both_serve(old: Pod, new: Pod) -> None:
            before = load.served.copy()
            wait_for(
                f"{old.name} and {new.name} both taking messages",
                lambda: (
                    min(
                        load.served[old.name] - before[old.name],
                        load.served[new.name] - before[new.name],
                    )
                    >= 20
                ),
                60,
            )
            side_by_side.append((old.name, load.served[old.name], new.name, load.served[new.name]))

        roll(cluster, installed.apis, API, both_serve)
        roll(cluster, installed.workers, DELIVERY)
        sent = load.finish()
        print(
            f"upgrade from {previous_release.revision[:12]}: schema {old_schema} -> "
            f"{new_schema}, {len(sent)} messages sent, {len(load.failures)} calls retried, "
            f"side by side: {side_by_side}, previous ingest exited {old_ingest_exit}"
        )
        assert len(side_by_side) == 2
        assert {p.container["image"] for p in cluster.pods} >= {previous_release.image, image}
        # Then every message arrives, each group's in the order sent, none twice
        assert_delivered_in_order(webhook, sent)
    except BaseException:
        show_logs(cluster)
        raise
    finally:
        cluster.down()
