"""A blocking HTTP client for produce (docs/design.md §5), standard library only.

Every retry sends the same message ids (and sequence ids), so a retried message that had
reached Kafka the first time is delivered once: message ids travel to the webhook as
``webhook-id``, and messages with a producer id are de-duplicated by ingest. Retried: connection
failures, timeouts, 429 (after its ``Retry-After``), 500, 502, 503 and 504; a batch answered 207
is retried for its failed messages only. Anything else raises :class:`HttpError` at once.

::

    client = HttpClient("http://localhost:8080", key)
    client.produce("shop", "orders", b'{"total": 12}', group_id="order-7")

    producer = client.producer("shop", "orders", "checkout-1")  # resumes after its last id
    producer.send(b"...", group_id="order-7")
"""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from setu.client.errors import HttpError, SetuClientError
from setu.client.stream import Backoff

_RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


@dataclass(frozen=True, slots=True)
class Message:
    """One message of a batch; ``message_id`` is made (a UUID) when not given."""

    body: bytes | str
    message_id: str | None = None
    group_id: str | None = None
    producer_id: str | None = None
    sequence_id: int | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    content_type: str | None = None


class HttpClient:
    """Produce over HTTP, with retries that reuse ids (see the module doc)."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout_s: float = 10.0,
        attempts: int = 6,
        backoff: Backoff | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._auth = f"Bearer {api_key}"
        self._timeout_s = timeout_s
        self._attempts = max(1, attempts)
        self._backoff = backoff or Backoff(initial_s=0.2, max_s=5.0)

    def produce(
        self,
        project: str,
        topic: str,
        body: bytes | str,
        *,
        message_id: str | None = None,
        group_id: str | None = None,
        producer_id: str | None = None,
        sequence_id: int | None = None,
        headers: Mapping[str, str] | None = None,
        content_type: str | None = None,
    ) -> str:
        """Produces one message; returns its message id once Kafka holds it."""
        message_id = message_id or str(uuid.uuid4())
        sent = {"X_MESSAGE_ID": message_id}
        if group_id is not None:
            sent["X_GROUP_ID"] = group_id
        if producer_id is not None:
            sent["X_PRODUCER_ID"] = producer_id
        if sequence_id is not None:
            sent["X_SEQUENCE_ID"] = str(sequence_id)
        if content_type is not None:
            sent["Content-Type"] = content_type
        sent.update(headers or {})
        data = body.encode() if isinstance(body, str) else body
        self._call("POST", _topic_path(project, topic) + "/produce", data, sent)
        return message_id

    def produce_batch(self, project: str, topic: str, messages: Sequence[Message]) -> list[str]:
        """Produces a batch; returns the message ids once Kafka holds every message. Messages
        that failed are sent again (same ids) until they succeed or the attempts run out."""
        items = [_batch_item(m) for m in messages]
        ids = [str(item["message_id"]) for item in items]
        path = _topic_path(project, topic) + "/produce/batch"
        left = items
        for attempt in range(self._attempts):
            status, document = self._call(
                "POST", path, json.dumps({"messages": left}).encode(), {}, multi=True
            )
            if status == 200:
                return ids
            results = document.get("results", [])
            failed = {r["message_id"] for r in results if r.get("status") != "ok"}
            left = [item for item in left if item["message_id"] in failed] or left
            if attempt + 1 < self._attempts:
                time.sleep(self._backoff.delay(attempt))
        raise HttpError(503, "dependency_unavailable", f"{len(left)} messages were not written")

    def last_sequence_id(self, project: str, topic: str, producer_id: str) -> int:
        """The highest sequence id Setu accepted from the producer, -1 if none."""
        path = f"{_topic_path(project, topic)}/producers/{urllib.parse.quote(producer_id, '')}"
        _, document = self._call("GET", path, None, {})
        return int(document["last_sequence_id"])

    def producer(self, project: str, topic: str, producer_id: str) -> SequencedProducer:
        """A producer that numbers its messages, resuming after its last accepted id."""
        return SequencedProducer(self, project, topic, producer_id)

    def _call(
        self,
        method: str,
        path: str,
        data: bytes | None,
        headers: Mapping[str, str],
        *,
        multi: bool = False,
    ) -> tuple[int, dict[str, Any]]:
        """One request with retries; (status, JSON document). With ``multi``, a 207 or 503
        batch answer is returned for the caller to retry what failed."""
        last: SetuClientError | None = None
        for attempt in range(self._attempts):
            request = urllib.request.Request(self.base_url + path, data=data, method=method)
            request.add_header("Authorization", self._auth)
            if data is not None and "Content-Type" not in headers:
                request.add_header("Content-Type", "application/json" if multi else _OCTETS)
            for name, value in headers.items():
                request.add_header(name, value)
            wait = self._backoff.delay(attempt)
            try:
                with urllib.request.urlopen(request, timeout=self._timeout_s) as response:
                    return response.status, _document(response.read())
            except urllib.error.HTTPError as exc:
                status, document = exc.code, _document(exc.read())
                if multi and status in (207, 503) and "results" in document:
                    return status, document
                error = document.get("error", {})
                last = HttpError(
                    status, error.get("code", str(status)), error.get("message", exc.reason)
                )
                if status not in _RETRY_STATUSES:
                    raise last from None
                retry_after = exc.headers.get("Retry-After", "")
                if retry_after.isdigit():
                    wait = max(wait, float(retry_after))
            except (urllib.error.URLError, OSError) as exc:
                last = SetuClientError("dependency_unavailable", f"could not reach Setu: {exc}")
            if attempt + 1 < self._attempts:
                time.sleep(wait)
        assert last is not None
        raise last


class SequencedProducer:
    """Sends with a producer id and increasing sequence ids, starting after the highest id
    Setu accepted (``GET …/producers/{id}``). Message ids are ``{producer_id}:{sequence_id}``,
    as streaming produce makes them."""

    def __init__(self, client: HttpClient, project: str, topic: str, producer_id: str) -> None:
        self._client = client
        self.project, self.topic, self.producer_id = project, topic, producer_id
        self.next_sequence = client.last_sequence_id(project, topic, producer_id) + 1

    def send(
        self,
        body: bytes | str,
        *,
        group_id: str | None = None,
        headers: Mapping[str, str] | None = None,
        content_type: str | None = None,
    ) -> str:
        sequence = self.next_sequence
        message_id = self._client.produce(
            self.project,
            self.topic,
            body,
            message_id=f"{self.producer_id}:{sequence}",
            group_id=group_id,
            producer_id=self.producer_id,
            sequence_id=sequence,
            headers=headers,
            content_type=content_type,
        )
        self.next_sequence = sequence + 1
        return message_id

    def send_batch(self, messages: Sequence[Message]) -> list[str]:
        """Numbers the messages in order (their own producer and sequence ids are ignored)."""
        first = self.next_sequence
        numbered = [
            Message(
                m.body,
                f"{self.producer_id}:{first + i}",
                m.group_id,
                self.producer_id,
                first + i,
                m.headers,
                m.content_type,
            )
            for i, m in enumerate(messages)
        ]
        ids = self._client.produce_batch(self.project, self.topic, numbered)
        self.next_sequence = first + len(messages)
        return ids


_OCTETS = "application/octet-stream"


def _topic_path(project: str, topic: str) -> str:
    quote = urllib.parse.quote
    return f"/v1/projects/{quote(project, '')}/topics/{quote(topic, '')}"


def _document(raw: bytes) -> dict[str, Any]:
    try:
        document = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return document if isinstance(document, dict) else {}


def _batch_item(message: Message) -> dict[str, object]:
    item: dict[str, object] = {"message_id": message.message_id or str(uuid.uuid4())}
    if isinstance(message.body, str):
        item["body"] = message.body
    else:
        item["body_base64"] = base64.b64encode(message.body).decode()
    for name in ("group_id", "producer_id", "sequence_id", "content_type"):
        value = getattr(message, name)
        if value is not None:
            item[name] = value
    if message.headers:
        item["headers"] = dict(message.headers)
    return item
