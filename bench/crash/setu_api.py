"""The few Setu API calls the harness makes, each retried while the API restarts.

Only the harness's own set-up and drain go through here; the producer has its own client.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any
from urllib.parse import quote

import httpx

# Statuses worth another try: the API or one of its dependencies is coming back.
TRANSIENT = frozenset({408, 425, 429, 500, 502, 503, 504})


BREAKER_EVENTS = ["endpoint.breaker_opened", "endpoint.breaker_closed"]


class SetuApiError(Exception):
    """Raised when the API answers a definite error, or does not answer before the deadline."""


class SetuApi:
    """One project, topic and subscription of a Setu API at ``base_url``."""

    def __init__(
        self, client: httpx.AsyncClient, project: str, topic: str, subscription: str
    ) -> None:
        self.client = client
        self.project = project
        self.topic = topic
        self.subscription = subscription

    @property
    def _p(self) -> str:
        return f"/v1/projects/{quote(self.project)}"

    @property
    def _s(self) -> str:
        return f"{self._p}/subscriptions/{quote(self.subscription)}"

    async def call(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        ok: tuple[int, ...] = (200, 201),
        timeout_s: float = 60.0,
    ) -> Any:
        """Send until a status in ``ok`` (returns the JSON body) or a definite error (raises)."""
        deadline = time.monotonic() + timeout_s
        last = "no answer"
        while time.monotonic() < deadline:
            try:
                response = await self.client.request(method, path, json=json)
            except httpx.HTTPError as error:
                last = repr(error)
            else:
                if response.status_code in ok:
                    return response.json() if response.content else None
                last = f"{response.status_code} {response.text}"
                if response.status_code not in TRANSIENT:
                    raise SetuApiError(f"{method} {path}: {last}")
            await asyncio.sleep(0.25)
        raise SetuApiError(f"{method} {path}: gave up after {timeout_s:.0f} s: {last}")

    async def wait_healthy(self, timeout_s: float) -> None:
        await self.call("GET", "/v1/health", timeout_s=timeout_s)

    def named(self, subscription: str) -> SetuApi:
        """The same API, project and topic, for another subscription."""
        return SetuApi(self.client, self.project, self.topic, subscription)

    async def create_resources(
        self,
        *,
        partitions: int,
        endpoint_url: str,
        retry_delays_ms: list[int],
        signing_secret: str | None,
        timeout_ms: int,
        circuit_breaker: dict[str, Any] | None = None,
        events_url: str | None = None,
    ) -> None:
        """Project, grouped topic and grouped ``park`` subscription (docs/design.md §5), with
        ``circuit_breaker`` (and no auto-pause: the run must drain) and breaker events sent to
        ``events_url`` (docs/policies.md §2, §4)."""
        await self.call("POST", "/v1/projects", json={"name": self.project})
        topic = {"name": self.topic, "grouped": True, "partitions": partitions}
        await self.call("POST", f"{self._p}/topics", json=topic)
        await self.create_subscription(
            endpoint_url=endpoint_url,
            retry_delays_ms=retry_delays_ms,
            signing_secret=signing_secret,
            timeout_ms=timeout_ms,
            circuit_breaker=circuit_breaker,
        )
        if events_url is not None:
            wanted = {"url": events_url, "events": BREAKER_EVENTS}
            await self.call("PUT", f"{self._p}/notifications", json=wanted)

    async def create_subscription(
        self,
        *,
        endpoint_url: str,
        retry_delays_ms: list[int],
        signing_secret: str | None,
        timeout_ms: int,
        circuit_breaker: dict[str, Any] | None = None,
    ) -> None:
        """This grouped ``park`` subscription of the topic (see :meth:`create_resources`)."""
        subscription: dict[str, Any] = {
            "name": self.subscription,
            "topic": self.topic,
            "grouped": True,
            "endpoint": {"url": endpoint_url, "timeout_ms": timeout_ms},
            "retry": {"delays_ms": retry_delays_ms},
            "dead_letter_policy": "park",
            "circuit_breaker": circuit_breaker,
            "auto_pause_after_s": None,
        }
        if signing_secret is not None:
            subscription["signing_secret"] = signing_secret
        await self.call("POST", f"{self._p}/subscriptions", json=subscription)

    async def group_state(self, group_id: str, timeout_s: float = 10.0) -> dict[str, Any]:
        path = f"{self._s}/groups/{quote(group_id)}"
        result: dict[str, Any] = await self.call("GET", path, timeout_s=timeout_s)
        return result

    async def unsideline(self, group_ids: list[str], timeout_s: float = 30.0) -> int:
        body = {"group_ids": group_ids}
        path = f"{self._s}/dlq/unsideline"
        result = await self.call("POST", path, json=body, timeout_s=timeout_s)
        return int(result.get("requeued", 0)) if isinstance(result, dict) else 0

    async def unsideline_failed_before(self, before_ms: int, timeout_s: float = 30.0) -> int:
        """Every dead letter that failed before ``before_ms``, in one call."""
        body = {"failed_before": before_ms}
        path = f"{self._s}/dlq/unsideline"
        result = await self.call("POST", path, json=body, timeout_s=timeout_s)
        return int(result.get("requeued", 0)) if isinstance(result, dict) else 0

    async def status(self, timeout_s: float = 10.0) -> dict[str, Any]:
        result: dict[str, Any] = await self.call("GET", f"{self._s}/status", timeout_s=timeout_s)
        return result
