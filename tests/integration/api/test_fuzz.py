"""The API fuzzed from its own OpenAPI document with ``schemathesis``, over real HTTP against a
live server (docs/security.md §7).

Every operation gets generated requests, valid and invalid, authenticated with the admin key;
path parameters name a real project, topic and subscription (except on DELETE, so the fuzzing
does not remove what the rest of it needs). Every answer must be below 500 and conform to the
document: a documented status, content type, headers and body schema; invalid requests must
be refused. The run is bounded by ``SETU_FUZZ_EXAMPLES`` examples per operation and mode.

One check is left out: "schema-valid data must be accepted". The document cannot say every
rule the API applies (a webhook URL's scheme and address, a signing key's strength, "exactly
one of" three fields, the id rules of docs/design.md §2), so a request the document allows may
rightly get a 400; those rules have tests of their own.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.generation.modes import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance

from tests.integration.api.support import ADMIN_KEY, served_api

pytestmark = pytest.mark.integration

EXAMPLES = int(os.environ.get("SETU_FUZZ_EXAMPLES", "30"))
AUTH = {"Authorization": f"Bearer {ADMIN_KEY}"}
REQUESTS = {"sent": 0}


class World:
    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.project = f"fz{uuid.uuid4().hex[:8]}"
        self.names = {"project": self.project, "topic": "t", "subscription": "s"}


@pytest.fixture(scope="module")
def world(
    kafka_bootstrap: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    data: Path = tmp_path_factory.mktemp("fuzz")
    with (
        served_api(data, kafka_bootstrap=kafka_bootstrap, redis_url=redis_url) as url,
        httpx.Client(base_url=url, headers=AUTH, timeout=30) as client,
    ):
        w = World(url)
        for path, body in (
            ("/v1/projects", {"name": w.project}),
            (f"/v1/projects/{w.project}/topics", {"name": "t", "grouped": True, "partitions": 1}),
            (
                f"/v1/projects/{w.project}/subscriptions",
                {"name": "s", "topic": "t", "endpoint": {"url": "https://hooks.example.com/x"}},
            ),
        ):
            made = client.post(path, json=body)
            assert made.status_code == 201, made.text
        yield w
        print(f"\nfuzz: {REQUESTS['sent']} requests")
        clean(client, w.project)


def clean(client: httpx.Client, project: str) -> None:
    """Deletes what the fuzzing made in the project, Kafka topics included."""
    base = f"/v1/projects/{project}"
    for sub in client.get(f"{base}/subscriptions").json().get("subscriptions", []):
        client.delete(f"{base}/subscriptions/{sub['name']}")
    for topic in client.get(f"{base}/topics").json().get("topics", []):
        client.delete(f"{base}/topics/{topic['name']}")
    client.delete(base)


def small_topics(case: Any) -> bool:
    """Topics of up to 12 partitions: the suite shares one single-node broker, which hundreds
    of 1,000-partition topics would slow for every later test (the partition limit has a test
    of its own)."""
    body = case.body
    partitions = body.get("partitions") if isinstance(body, dict) else None
    return not isinstance(partitions, int) or partitions <= 12


def test_every_operation_answers_below_500_and_as_documented(world: World) -> None:
    schema = schemathesis.openapi.from_url(f"{world.base_url}/openapi.json")
    # A body over its route's limit is refused with 413 before it is read (api/gate.py): a
    # rejection like any other (a replay request's message ids once grew past 1 MiB).
    rejection = schema.config.checks.negative_data_rejection
    rejection.expected_statuses = [*rejection.expected_statuses, "413"]
    failures: dict[str, str] = {}
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) > 30
    for operation in operations:
        fixed = {} if operation.method.upper() == "DELETE" else world.names
        path_parameters = {
            name: value for name, value in fixed.items() if "{" + name + "}" in operation.path
        }
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            strategy = operation.as_strategy(mode, path_parameters=path_parameters).filter(
                small_topics
            )

            @settings(
                max_examples=EXAMPLES,
                deadline=None,
                derandomize=True,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            @given(case=strategy)
            def call(case: Any) -> None:
                REQUESTS["sent"] += 1
                case.call_and_validate(
                    base_url=world.base_url,
                    headers=AUTH,
                    timeout=30,
                    excluded_checks=[positive_data_acceptance],
                )

            try:
                call()
            except Unsatisfiable:
                assert mode is GenerationMode.NEGATIVE  # an operation without any input
            except BaseException as exc:  # every operation is fuzzed; all findings are reported
                if isinstance(exc, KeyboardInterrupt):
                    raise
                failures[f"{operation.label} ({mode.value})"] = str(exc)[:3_000]
    assert not failures, "\n\n".join(f"{k}:\n{v}" for k, v in failures.items())
