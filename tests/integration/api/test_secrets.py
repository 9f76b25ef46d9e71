"""Secrets never leak (docs/security.md §5): planted secrets go through every path that
handles them, including a database failure in the middle of a create, and then the captured
logs, every answer, the metrics and the stored rows are searched for them. A failed create
also leaves no Kafka topic behind."""

from __future__ import annotations

import asyncio
import logging
import secrets
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from setu.names import dlq_topic, retry_topic, state_topic
from tests.integration.api.support import ADMIN_KEY, SECRET_KEY, Api, running_api, unique
from tests.tls_material import Authority

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

HOOK = "https://hooks.example.com/orders"


def planted() -> dict[str, str]:
    """Values that must appear nowhere but in the requests that set them."""
    return {
        "signing secret": "whsec_" + secrets.token_urlsafe(24),
        "next signing secret": "whsec_" + secrets.token_urlsafe(24),
        "header value": "Bearer hv-" + secrets.token_urlsafe(24),
        "oauth2 client secret": "cs-" + secrets.token_urlsafe(24),
    }


FAIL_INSERTS = """
CREATE FUNCTION refuse_insert() RETURNS trigger AS $$
BEGIN RAISE EXCEPTION 'inserts refused by the test' USING ERRCODE = 'XX000'; END
$$ LANGUAGE plpgsql;
CREATE TRIGGER refuse_insert BEFORE INSERT ON subscriptions
FOR EACH ROW EXECUTE FUNCTION refuse_insert();
"""


async def test_no_secret_reaches_logs_answers_metrics_or_rows_even_through_a_500(
    pg_url: str,
    kafka_bootstrap: str,
    redis_url: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    plant = planted()
    answers: list[str] = []
    async with running_api(
        tmp_path, kafka_bootstrap=kafka_bootstrap, redis_url=redis_url, database_url=pg_url
    ) as api:
        project = unique()
        await api.client.post("/v1/projects", json={"name": project})
        await api.client.post(f"/v1/projects/{project}/topics", json={"name": "t", "partitions": 1})
        subs = f"/v1/projects/{project}/subscriptions"
        # A key of the project: shown once, then only used
        made = await api.client.post(
            f"/v1/projects/{project}/keys", json={"name": "k", "role": "owner"}
        )
        plant["api key"] = made.json()["key"]
        owner = {"Authorization": f"Bearer {plant['api key']}"}
        identity = Authority().client("orders")
        # The private key's base64 body, without its PEM armour
        plant["client key"] = "".join(identity.key.strip().splitlines()[1:-1])
        body = {
            "name": "s",
            "topic": "t",
            "endpoint": {
                "url": HOOK,
                "headers": {"X-Api-Key": plant["header value"]},
                "tls": {"client_certificate": identity.certificate, "client_key": identity.key},
                "oauth2": {
                    "token_url": "https://auth.example.com/oauth/token",
                    "client_id": "setu",
                    "client_secret": plant["oauth2 client secret"],
                },
            },
            "signing_secret": plant["signing secret"],
        }
        # Given every path that takes a secret: create, rotate, PUT, bad requests
        created = await api.client.post(subs, json=body, headers=owner)
        assert created.status_code == 201, created.text
        answers.append(created.text)
        # (held, and said to be)
        assert created.json()["endpoint"]["tls"]["has_client_key"] is True
        assert created.json()["endpoint"]["oauth2"]["has_client_secret"] is True
        other = Authority().client("other")
        for request in (
            api.client.get(f"{subs}/s", headers=owner),
            api.client.post(
                f"{subs}/s/signing-secrets",
                json={"signing_secret": plant["next signing secret"]},
                headers=owner,
            ),
            api.client.put(
                f"{subs}/s",
                json={**body, "version": 1, "max_in_flight": 0},
                headers=owner,
            ),
            api.client.post(subs, json={**body, "endpoint": {"url": "ftp://x"}}, headers=owner),
            # a key that is not the certificate's, the planted one beside it
            api.client.post(
                subs,
                json={
                    **body,
                    "name": "s3",
                    "endpoint": {
                        **body["endpoint"],  # type: ignore[dict-item]
                        "tls": {
                            "client_certificate": other.certificate,
                            "client_key": identity.key,
                        },
                    },
                },
                headers=owner,
            ),
            api.client.get(subs, headers=owner),
            api.client.get("/metrics"),
        ):
            answers.append((await request).text)
        # When the database refuses the next insert (a 500 in the middle of a create)
        await asyncio.to_thread(refuse_inserts, pg_url)
        # (a client that gets the 500 answer rather than the exception behind it)
        transport = httpx.ASGITransport(app=api.app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://setu") as client:
            failed = await client.post(subs, json={**body, "name": "s2"}, headers=owner)
        answers.append(failed.text)
        assert failed.status_code == 500, failed.text
        # Then the failed create left no Kafka topic behind
        for name in (
            state_topic(project, "s2"),
            retry_topic(project, "s2", 1),
            dlq_topic(project, "s2"),
        ):
            assert await partitions(api, name) is None, name
        # And the 500 was logged, with its cause, and nothing secret in it
        assert "inserts refused by the test" in caplog.text
        for what, value in plant.items():
            assert value not in caplog.text, f"{what} in the logs"
            for text in answers:
                assert value not in text, f"{what} in an answer: {text[:200]}"
        # And the rows hold neither the values nor the bootstrap keys
        rows = await asyncio.to_thread(dump_rows, pg_url)
        for what, value in {**plant, "admin key": ADMIN_KEY, "sealing key": SECRET_KEY}.items():
            assert value not in rows, f"{what} in the database"
            assert value not in caplog.text, f"{what} in the logs"


async def partitions(api: Api, kafka_topic: str) -> int | None:
    return await asyncio.to_thread(api.app.state.kafka_admin.partition_count, kafka_topic)


def refuse_inserts(url: str) -> None:
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(FAIL_INSERTS)
    finally:
        engine.dispose()


def dump_rows(url: str) -> str:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return "\n".join(
                str(conn.execute(sa.text(f"SELECT * FROM {table}")).all())
                for table in ("projects", "topics", "subscriptions", "api_keys")
            )
    finally:
        engine.dispose()
