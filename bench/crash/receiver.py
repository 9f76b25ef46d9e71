"""The crash test's webhook: answers by the failure plan and journals every call durably.

Run as its own process (``python -m bench.crash.receiver``) so it outlives every kill. Each call
becomes one journal entry: ``t`` (ms), ``mid`` (``X_MESSAGE_ID``), ``gid`` (``X_GROUP_ID``),
``wid`` (``webhook-id``), ``attempt`` (``X_DELIVERY_ATTEMPT``), ``status`` (what it answered),
``hash`` (SHA-256 of the body), ``sig`` (signature valid: true/false, null without a secret),
``sub`` (the subscription: the path after ``/hook/``, or ``hook`` for ``/hook`` itself; each
subscription of a fan-out run has its own endpoint path, and the plan applies to each alone).

``POST /events`` takes Setu's operational events (docs/policies.md §4) into a journal of their
own, ``events.journal`` beside the calls' (``t``, ``id``, ``type``, ``at_ms``, ``data``).

``POST /control/phase {"phase": "drain"}`` switches to answering 2xx to everything;
``GET /control/stats`` returns the call counts.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import hashlib
import hmac
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bench.crash.journal import Entry, Journal, read_entries
from bench.crash.plan import FailurePlan, FailureSchedule, Phase, decide_status
from bench.crash.records import payload_hash
from setu.clock import now_ms
from setu.headers import DELIVER_AT, DELIVERY_ATTEMPT, GROUP_ID, MESSAGE_ID, canonical


def signature_keys(secret: str) -> list[bytes]:
    """HMAC keys a secret may stand for: base64 after an optional ``whsec_`` prefix (as the
    Standard Webhooks libraries read it), or its plain UTF-8 bytes."""
    keys = [secret.encode()]
    with contextlib.suppress(ValueError):
        keys.insert(0, base64.b64decode(secret.removeprefix("whsec_"), validate=True))
    return keys


def signature_valid(
    secret: str, webhook_id: str, timestamp: str, body: bytes, header: str | None
) -> bool:
    """True when one ``v1,<base64>`` of ``header`` is the HMAC-SHA256 of ``id.timestamp.body``."""
    if not header:
        return False
    signed = f"{webhook_id}.{timestamp}.".encode() + body
    expected = {
        base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
        for key in signature_keys(secret)
    }
    for part in header.split():
        version, _, value = part.partition(",")
        if version == "v1" and any(hmac.compare_digest(value, e) for e in expected):
            return True
    return False


def identity_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """``X_MESSAGE_ID`` & co. under canonical names, whichever spelling the caller used."""
    return {canonical(name): value for name, value in headers.items()}


# The events the receiver journals when the plan's outage opens and ends (bench/crash/plan.py).
OUTAGE_STARTED = "outage.started"
OUTAGE_ENDED = "outage.ended"
# The subscription whose endpoint is ``/hook`` itself (bench/crash/run.py).
FIRST_SUBSCRIPTION = "hook"


def subscription_of(entry: Entry) -> str:
    """The subscription a journalled call was made for (older journals: the first)."""
    return str(entry.get("sub", FIRST_SUBSCRIPTION))


def events_journal(journal_path: Path) -> Path:
    """Where the receiver journals operational events, beside its calls' journal."""
    return journal_path.parent / "events.journal"


class Receiver:
    """The webhook's state: plan, phase, journal and counters."""

    def __init__(self, plan: FailurePlan, journal_path: Path, secret: str | None = None) -> None:
        self.plan = plan
        self.schedule = FailureSchedule(plan)
        self.phase = Phase.RUN
        self.secret = secret
        self.journal = Journal(journal_path)
        self.events = Journal(events_journal(journal_path))
        self.calls = 0
        self.ok_calls = 0
        self.last_call_ms = 0
        # Calls per (subscription, message), for the plan's flaky groups
        self.calls_by_message: Counter[tuple[str, str]] = Counter()

    async def open(self) -> None:
        # A receiver started again on its journal goes on counting each message's calls.
        calls = read_entries(self.journal.path)
        self.calls_by_message = Counter((subscription_of(e), e["mid"]) for e in calls)
        # And its outage where it was: opened, ended, and how many calls it failed
        events = read_entries(self.events.path)
        started = next((e["at_ms"] for e in events if e["type"] == OUTAGE_STARTED), None)
        ended = next((e["at_ms"] for e in events if e["type"] == OUTAGE_ENDED), None)
        failed = 0
        if started is not None:
            failed = sum(
                1
                for e in calls
                if e["t"] >= started and (ended is None or e["t"] < ended) and e["status"] >= 500
            )
        self.schedule.resume_outage(started, ended, failed)
        await self.journal.open()
        await self.events.open()

    async def close(self) -> None:
        await self.journal.close()
        await self.events.close()

    async def handle_event(self, body: bytes) -> None:
        event = orjson.loads(body)
        await self.events.append(
            {
                "t": now_ms(),
                "id": event.get("id"),
                "type": event.get("type"),
                "at_ms": event.get("at_ms"),
                "data": event.get("data"),
            }
        )

    async def handle_call(
        self, headers: Mapping[str, str], body: bytes, subscription: str = FIRST_SUBSCRIPTION
    ) -> int:
        """Journal one webhook call made for ``subscription`` and return the status to answer."""
        named = identity_headers(headers)
        message_id = named.get(MESSAGE_ID, "")
        group_id = named.get(GROUP_ID, "")
        webhook_id = headers.get("webhook-id", "")
        timestamp = headers.get("webhook-timestamp", "")
        now = now_ms()
        before = self.calls_by_message[subscription, message_id]
        started, ended = self.schedule.outage_started, self.schedule.outage_ended
        status = decide_status(self.schedule, self.phase, group_id, message_id, now, before)
        for kind, before_call, after_call in (
            (OUTAGE_STARTED, started, self.schedule.outage_started),
            (OUTAGE_ENDED, ended, self.schedule.outage_ended),
        ):
            if after_call != before_call:
                await self.events.append(
                    {"t": now, "id": None, "type": kind, "at_ms": now, "data": None}
                )
        self.calls_by_message[subscription, message_id] += 1
        sig = None
        if self.secret is not None:
            sig = signature_valid(
                self.secret, webhook_id, timestamp, body, headers.get("webhook-signature")
            )
        entry = {
            "t": now,
            "mid": message_id,
            "gid": group_id,
            "wid": webhook_id,
            "ts": timestamp,
            "attempt": named.get(DELIVERY_ATTEMPT, ""),
            "status": status,
            "hash": payload_hash(body),
            "sig": sig,
            "sub": subscription,
        }
        if DELIVER_AT in named:  # a scheduled message: never to be called before its time
            entry["dat"] = int(named[DELIVER_AT])
        # The answer goes out only after its entry is fsynced: a 2xx that Setu may record as
        # delivered must be in the journal even if this process or the machine dies right
        # after, or the checker would call a rightly delivered message lost.
        await self.journal.append(entry)
        self.calls += 1
        self.ok_calls += 200 <= status < 300
        self.last_call_ms = now
        return status


def make_app(receiver: Receiver, *, manage_journal: bool = True) -> Starlette:
    """The ASGI app. With ``manage_journal`` the app's lifespan opens and closes the journal."""

    async def hook(request: Request) -> Response:
        subscription = request.path_params.get("rest") or FIRST_SUBSCRIPTION
        status = await receiver.handle_call(request.headers, await request.body(), subscription)
        return Response(status_code=status)

    async def event(request: Request) -> Response:
        await receiver.handle_event(await request.body())
        return Response(status_code=204)

    async def set_phase(request: Request) -> Response:
        receiver.phase = Phase(orjson.loads(await request.body())["phase"])
        return JSONResponse({"phase": receiver.phase.value})

    async def stats(_: Request) -> Response:
        return JSONResponse(
            {
                "phase": receiver.phase.value,
                "calls": receiver.calls,
                "ok_calls": receiver.ok_calls,
                "last_call_ms": receiver.last_call_ms,
            }
        )

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        if manage_journal:
            await receiver.open()
        try:
            yield
        finally:
            if manage_journal:
                await receiver.close()

    routes = [
        Route("/hook", hook, methods=["POST", "PUT"]),
        Route("/hook/{rest:path}", hook, methods=["POST", "PUT"]),
        Route("/events", event, methods=["POST"]),
        Route("/control/phase", set_phase, methods=["POST"]),
        Route("/control/stats", stats, methods=["GET"]),
    ]
    return Starlette(routes=routes, lifespan=lifespan)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Crash-test webhook receiver")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--plan", type=Path, required=True, help="failure plan JSON")
    parser.add_argument("--journal", type=Path, required=True)
    parser.add_argument("--secret", default=None, help="subscription signing secret")
    args = parser.parse_args(argv)
    plan = FailurePlan.from_json(orjson.loads(args.plan.read_bytes()))
    app = make_app(Receiver(plan, args.journal, args.secret))
    config = uvicorn.Config(
        app, host=args.host, port=args.port, log_level="warning", access_log=False
    )
    asyncio.run(uvicorn.Server(config).serve())


if __name__ == "__main__":
    main()
