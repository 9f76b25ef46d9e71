"""``setu.client.HttpClient`` against the API served over real HTTP: produce, batch, resume
after the last sequence id, retries that reuse ids, and refusals that are not retried."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from setu.client import Backoff, HttpClient, HttpError, Message
from setu.envelope import H_MESSAGE_ID, H_SEQUENCE_ID
from setu.names import ingest_topic
from state.producer_marks import ProducerMarks
from tests.integration.api.support import (
    ADMIN_KEY,
    headers_of,
    read_records,
    served_api,
    unique,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def base_url(
    kafka_bootstrap: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    with served_api(
        tmp_path_factory.mktemp("client-api"), kafka_bootstrap=kafka_bootstrap, redis_url=redis_url
    ) as url:
        yield url


def new_project(base_url: str, **extra: object) -> str:
    project = unique()
    auth = {"Authorization": f"Bearer {ADMIN_KEY}"}
    made = httpx.post(f"{base_url}/v1/projects", json={"name": project, **extra}, headers=auth)
    assert made.status_code == 201, made.text
    topic = httpx.post(
        f"{base_url}/v1/projects/{project}/topics",
        json={"name": "t", "grouped": True, "partitions": 3},
        headers=auth,
    )
    assert topic.status_code == 201, topic.text
    return project


def test_single_and_batch_produce_land_in_kafka(
    base_url: str, kafka_bootstrap: str, tmp_path: Path
) -> None:
    project = new_project(base_url)
    client = HttpClient(base_url, ADMIN_KEY)
    one = client.produce(project, "t", b"one", group_id="g", headers={"X_TRACE": "a"})
    ids = client.produce_batch(
        project,
        "t",
        [Message("two", group_id="g"), Message(b"\x00\xff", message_id="m-3", group_id="g")],
    )
    assert ids[1] == "m-3"
    found = read_records(kafka_bootstrap, ingest_topic(project, "t"), 3)
    assert sorted(r.value() or b"" for r in found) == [b"\x00\xff", b"one", b"two"]
    assert {headers_of(r)[H_MESSAGE_ID].decode() for r in found} == {one, *ids}
    # (header names are case-insensitive: HTTP servers hand them on lower-cased)
    forwarded = [{n.upper(): v for n, v in headers_of(r).items()} for r in found]
    assert sum(h.get("X_TRACE") == b"a" for h in forwarded) == 1


def test_a_sequenced_producer_resumes_after_the_last_accepted_id(
    base_url: str, redis_url: str, kafka_bootstrap: str
) -> None:
    # Given a producer whose sequences up to 41 Setu accepted (the mark ingest publishes)
    project = new_project(base_url)
    client = HttpClient(base_url, ADMIN_KEY)
    assert client.last_sequence_id(project, "t", "checkout") == -1
    marks = redis.Redis.from_url(redis_url)
    ProducerMarks(marks).raise_marks(project, "t", {"checkout": (0, 41)})
    marks.close()
    # When a sequenced producer starts, then it goes on at 42, numbering batches in order
    producer = client.producer(project, "t", "checkout")
    assert producer.next_sequence == 42
    assert producer.send(b"a", group_id="g") == "checkout:42"
    assert producer.send_batch([Message("b", group_id="g"), Message("c", group_id="g")]) == [
        "checkout:43",
        "checkout:44",
    ]
    assert producer.next_sequence == 45
    found = read_records(kafka_bootstrap, ingest_topic(project, "t"), 3)
    assert sorted(int(headers_of(r)[H_SEQUENCE_ID]) for r in found) == [42, 43, 44]


class CountingBackoff(Backoff):
    """No waiting; counts the attempts the client makes (it asks for a delay before each)."""

    def __init__(self) -> None:
        super().__init__(initial_s=0.0, max_s=0.0)
        object.__setattr__(self, "asked", [])

    def delay(self, attempt: int) -> float:
        self.asked.append(attempt)  # type: ignore[attr-defined]
        return 0.0


def test_a_refusal_is_raised_at_once_with_its_code(base_url: str) -> None:
    project = new_project(base_url)
    backoff = CountingBackoff()
    client = HttpClient(base_url, ADMIN_KEY, backoff=backoff)
    with pytest.raises(HttpError) as missing_group:
        client.produce(project, "t", b"x")
    assert missing_group.value.status == 400
    assert missing_group.value.code == "invalid_input"
    with pytest.raises(HttpError) as unknown:
        client.produce(project, "none", b"x", group_id="g")
    assert (unknown.value.status, unknown.value.code) == (404, "not_found")
    wrong = HttpClient(base_url, "setu_0000000000000000_nope", backoff=backoff)
    with pytest.raises(HttpError) as wrong_key:
        wrong.produce(project, "t", b"x")
    assert wrong_key.value.status == 401 and "nope" not in str(wrong_key.value)
    assert backoff.asked == [0, 0, 0]  # type: ignore[attr-defined]  # one attempt each


def test_a_throttled_produce_is_retried_with_the_same_id_after_retry_after(
    base_url: str, kafka_bootstrap: str
) -> None:
    # Given a project allowed one message per second
    project = new_project(base_url, quota={"messages_per_second": 1})
    client = HttpClient(base_url, ADMIN_KEY)
    # When three are produced back to back, the later ones answered 429 at first
    ids = [client.produce(project, "t", f"m{n}".encode(), group_id="g") for n in range(3)]
    # Then each was written once, under the id the client chose
    found = read_records(kafka_bootstrap, ingest_topic(project, "t"), 4, timeout_s=10)
    assert sorted(headers_of(r)[H_MESSAGE_ID].decode() for r in found) == sorted(ids)
    assert all(H_SEQUENCE_ID not in headers_of(r) for r in found)
