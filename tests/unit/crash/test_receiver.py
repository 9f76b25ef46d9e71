"""The crash-test webhook, driven in-process through httpx."""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from bench.crash.journal import read_entries
from bench.crash.plan import REJECT_STATUS, FailurePlan
from bench.crash.receiver import Receiver, make_app, signature_valid
from bench.crash.records import payload_hash

SECRET = "whsec_" + base64.b64encode(b"0123456789abcdef0123456789abcdef").decode()
PLAN = FailurePlan(windows={"g-down": ((0, 2**62),)}, rejected=frozenset({"m-bad"}))


def sign(secret_key: bytes, webhook_id: str, timestamp: str, body: bytes) -> str:
    mac = hmac.new(secret_key, f"{webhook_id}.{timestamp}.".encode() + body, hashlib.sha256)
    return "v1," + base64.b64encode(mac.digest()).decode()


def webhook_headers(mid: str, group: str, body: bytes, *, wid: str | None = None) -> dict[str, str]:
    wid = mid if wid is None else wid
    key = base64.b64decode(SECRET.removeprefix("whsec_"))
    return {
        "X_MESSAGE_ID": mid,
        "X_GROUP_ID": group,
        "X_DELIVERY_ATTEMPT": "1",
        "webhook-id": wid,
        "webhook-timestamp": "1700000000",
        "webhook-signature": sign(key, wid, "1700000000", body),
    }


@pytest.fixture
async def receiver(tmp_path: Path) -> AsyncIterator[Receiver]:
    receiver = Receiver(PLAN, tmp_path / "calls.log", SECRET)
    await receiver.open()
    yield receiver
    await receiver.close()


@pytest.fixture
async def client(receiver: Receiver) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=make_app(receiver, manage_journal=False))
    async with httpx.AsyncClient(transport=transport, base_url="http://receiver") as client:
        yield client


async def test_call_is_journalled_before_it_is_answered(
    client: httpx.AsyncClient, receiver: Receiver
) -> None:
    # Given a healthy group
    body = b"payload\x00\xff"
    # When Setu calls the webhook
    response = await client.post("/hook", content=body, headers=webhook_headers("m1", "g1", body))
    # Then it gets a 2xx, and the call is already in the journal on disk
    assert response.status_code == 200
    [entry] = read_entries(receiver.journal.path)
    assert entry["mid"] == "m1"
    assert entry["gid"] == "g1"
    assert entry["wid"] == "m1"
    assert entry["attempt"] == "1"
    assert entry["status"] == 200
    assert entry["hash"] == payload_hash(body)
    assert entry["sig"] is True


@pytest.mark.parametrize(
    ("mid", "group", "status"),
    [("m1", "g-down", 503), ("m-bad", "g1", 422), ("m-bad", "g-down", 422), ("m2", "g1", 200)],
)
async def test_answers_by_the_plan_and_journals_the_answer(
    client: httpx.AsyncClient, receiver: Receiver, mid: str, group: str, status: int
) -> None:
    response = await client.post("/hook", content=b"x", headers=webhook_headers(mid, group, b"x"))
    assert response.status_code == status
    assert read_entries(receiver.journal.path)[-1]["status"] == status


async def test_drain_phase_accepts_everything_but_a_rejected_messages_first_call(
    client: httpx.AsyncClient, receiver: Receiver
) -> None:
    # Given the harness switched to the drain phase
    response = await client.post("/control/phase", json={"phase": "drain"})
    assert response.json() == {"phase": "drain"}
    # Then failing groups get a 2xx, and a rejected message a 4xx only on its first call
    answers = []
    for mid, group in (("m1", "g-down"), ("m-bad", "g1"), ("m-bad", "g1")):
        response = await client.post(
            "/hook", content=b"x", headers=webhook_headers(mid, group, b"x")
        )
        answers.append(response.status_code)
    assert answers == [200, REJECT_STATUS, 200]
    stats = (await client.get("/control/stats")).json()
    assert (stats["calls"], stats["ok_calls"]) == (3, 2)
    assert stats["phase"] == "drain"


async def test_hyphen_spelling_and_any_path_are_accepted(
    client: httpx.AsyncClient, receiver: Receiver
) -> None:
    headers = webhook_headers("m1", "g1", b"x")
    headers["X-Message-Id"] = headers.pop("X_MESSAGE_ID")
    headers["x-group-id"] = headers.pop("X_GROUP_ID")
    response = await client.post("/hook/sub/a", content=b"x", headers=headers)
    assert response.status_code == 200
    entry = read_entries(receiver.journal.path)[-1]
    assert (entry["mid"], entry["gid"]) == ("m1", "g1")


async def test_wrong_webhook_id_or_signature_is_journalled_as_such(
    client: httpx.AsyncClient, receiver: Receiver
) -> None:
    headers = webhook_headers("m1", "g1", b"x", wid="other")
    await client.post("/hook", content=b"x", headers=headers)
    headers = webhook_headers("m2", "g1", b"x")
    await client.post("/hook", content=b"tampered", headers=headers)
    first, second = read_entries(receiver.journal.path)
    assert first["wid"] == "other"
    assert first["sig"] is True  # signed over the id it carries
    assert second["sig"] is False


async def test_without_a_secret_signatures_are_not_judged(tmp_path: Path) -> None:
    receiver = Receiver(PLAN, tmp_path / "calls.log")
    await receiver.open()
    await receiver.handle_call({"x_message_id": "m1", "x_group_id": "g1"}, b"x")
    await receiver.close()
    assert read_entries(tmp_path / "calls.log")[0]["sig"] is None


@pytest.mark.parametrize(
    ("secret", "key"),
    [
        (SECRET, base64.b64decode(SECRET.removeprefix("whsec_"))),
        ("c2VjcmV0", b"secret"),
        ("plain", b"plain"),
    ],
)
def test_signature_keys_follow_standard_webhooks_or_raw_secret(secret: str, key: bytes) -> None:
    header = "v0,zzz " + sign(key, "m", "1", b"body")
    assert signature_valid(secret, "m", "1", b"body", header)
    assert not signature_valid(secret, "m", "2", b"body", header)
    assert not signature_valid(secret, "m", "1", b"body", None)


async def test_a_flaky_groups_message_fails_its_first_calls_even_across_a_receiver_restart(
    tmp_path: Path,
) -> None:
    # Given a receiver whose plan fails each message of group f twice
    plan = FailurePlan(flaky={"f": 2})
    first = Receiver(plan, tmp_path / "calls.log")
    await first.open()
    headers = webhook_headers("m1", "f", b"x")
    assert await first.handle_call(headers, b"x") == 503
    await first.close()
    # When the receiver starts again on its journal
    second = Receiver(plan, tmp_path / "calls.log")
    await second.open()
    # Then it goes on counting the message's calls: one more 503, then 200
    assert [await second.handle_call(headers, b"x") for _ in range(2)] == [503, 200]
    await second.close()


async def test_each_subscriptions_calls_are_journalled_and_counted_as_its_own(
    tmp_path: Path,
) -> None:
    # Given a receiver whose plan fails each message of group f once, with a fan-out run's
    # subscriptions calling /hook and /hook/hook-002
    receiver = Receiver(FailurePlan(flaky={"f": 1}), tmp_path / "calls.log")
    transport = httpx.ASGITransport(app=make_app(receiver))
    async with httpx.AsyncClient(transport=transport, base_url="http://receiver") as client:
        await receiver.open()
        headers = webhook_headers("m1", "f", b"x")
        # When each subscription calls m1 twice
        statuses = [
            (await client.post(path, content=b"x", headers=headers)).status_code
            for path in ("/hook", "/hook", "/hook/hook-002", "/hook/hook-002")
        ]
        await receiver.close()
    # Then each one's first call failed (the plan is each subscription's own), and the journal
    # names the subscription of every call
    assert statuses == [503, 200, 503, 200]
    subs = [entry["sub"] for entry in read_entries(tmp_path / "calls.log")]
    assert subs == ["hook", "hook", "hook-002", "hook-002"]


async def test_an_outage_goes_on_across_a_receiver_restart_and_journals_its_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a receiver whose outage opens at 1,000 for a second, then until it failed 3 calls
    clock = iter([1_000, 2_500, 2_600, 2_700])
    monkeypatch.setattr("bench.crash.receiver.now_ms", lambda: next(clock))
    plan = FailurePlan(outage=(1_000, 2_000), outage_min_failures=3)
    first = Receiver(plan, tmp_path / "calls.log")
    await first.open()
    headers = webhook_headers("m1", "g", b"x")
    assert await first.handle_call(headers, b"x") == 503
    await first.close()
    # When the receiver dies and starts again on its journals after the outage's length
    second = Receiver(plan, tmp_path / "calls.log")
    await second.open()
    # Then the outage it opened goes on until it failed its three calls (it did not open a
    # second one), and the receiver journals when it ended
    assert [await second.handle_call(headers, b"x") for _ in range(3)] == [503, 503, 200]
    await second.close()
    events = [(e["type"], e["at_ms"]) for e in read_entries(tmp_path / "events.journal")]
    assert events == [("outage.started", 1_000), ("outage.ended", 2_700)]
