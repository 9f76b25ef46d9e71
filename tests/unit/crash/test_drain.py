"""The drain phase against a fake subscription API (dead-lettered groups, unsideline)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.crash.drain import drain
from bench.crash.setu_api import SetuApi


class FakeSubscription:
    """Dead-lettered groups hold message ids; unsidelining one "delivers" them to the journal.
    ``parked`` is the first subscription's (``hook``), ``others`` those of further ones."""

    def __init__(
        self,
        journal: Path,
        parked: dict[str, list[str]],
        *,
        has_status: bool = True,
        others: dict[str, dict[str, list[str]]] | None = None,
    ):
        self.journal = journal
        self.parked_by = {"hook": parked, **(others or {})}
        self.has_status = has_status
        self.unsidelined: list[list[str]] = []
        self.unsidelined_by: dict[str, list[str]] = {}
        self.group_lookups = 0
        self.phase = "run"

    @property
    def parked(self) -> dict[str, list[str]]:
        return self.parked_by["hook"]

    def deliver(self, mid: str, group: str, subscription: str = "hook") -> None:
        entry = {
            "mid": mid,
            "gid": group,
            "wid": mid,
            "status": 200,
            "hash": "h",
            "sig": None,
            "sub": subscription,
        }
        with self.journal.open("ab") as handle:
            handle.write(orjson.dumps(entry) + b"\n")

    def api(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        name = path.split("/subscriptions/", 1)[1].split("/", 1)[0]
        parked = self.parked_by.setdefault(name, {})
        if path.endswith("/status"):
            if not self.has_status:
                return httpx.Response(404, json={"error": {"code": "not_found", "message": ""}})
            return httpx.Response(200, json={"failed_groups": len(parked)})
        if "/groups/" in path:
            self.group_lookups += 1
            group = path.rsplit("/", 1)[1]
            state = "dead_lettered" if group in parked else "healthy"
            return httpx.Response(200, json={"group_id": group, "state": state})
        if path.endswith("/dlq/unsideline"):
            body = orjson.loads(request.content)
            groups = body.get("group_ids") or sorted(parked)  # or all, by failed_before
            self.unsidelined.append(groups)
            self.unsidelined_by.setdefault(name, []).extend(groups)
            for group in groups:
                for mid in parked.pop(group, []):
                    self.deliver(mid, group, name)
            return httpx.Response(200, json={"requeued": len(groups)})
        return httpx.Response(404)

    def receiver(self, request: httpx.Request) -> httpx.Response:
        self.phase = orjson.loads(request.content)["phase"]
        return httpx.Response(200, json={"phase": self.phase})


def write_producer_journal(path: Path, records: list[tuple[str, str, bool]]) -> None:
    lines = []
    for seq, (mid, group, acked) in enumerate(records):
        lines.append({"e": "sent", "pid": "p", "seq": seq, "mid": mid, "gid": group, "hash": "h"})
        if acked:
            lines.append({"e": "ack", "pid": "p", "seq": seq, "via": "http"})
    path.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))


async def run_drain(
    fake: FakeSubscription,
    tmp_path: Path,
    timeout_s: float,
    subscriptions: tuple[str, ...] = ("hook",),
) -> dict[str, Any]:
    api_client = httpx.AsyncClient(transport=httpx.MockTransport(fake.api), base_url="http://api")
    receiver = httpx.AsyncClient(
        transport=httpx.MockTransport(fake.receiver), base_url="http://receiver"
    )
    async with api_client, receiver:
        return await drain(
            [SetuApi(api_client, "p", "t", name) for name in subscriptions],
            receiver,
            tmp_path / "producer.journal",
            fake.journal,
            timeout_s=timeout_s,
            quiet_s=0.05,
            say=lambda line: None,
            poll_s=0.01,
        )


async def test_unsidelines_dead_lettered_groups_until_everything_is_delivered(
    tmp_path: Path,
) -> None:
    # Given a1 delivered, and groups b and c dead-lettered holding b1 and c1, c2
    write_producer_journal(
        tmp_path / "producer.journal",
        [("a1", "a", True), ("b1", "b", True), ("c1", "c", True), ("c2", "c", True)],
    )
    fake = FakeSubscription(tmp_path / "receiver.journal", {"b": ["b1"], "c": ["c1", "c2"]})
    fake.deliver("a1", "a")
    # When the drain runs
    result = await run_drain(fake, tmp_path, timeout_s=5.0)
    # Then the receiver accepts everything, both groups were unsidelined, and the run is quiet
    assert fake.phase == "drain"
    assert sorted(g for call in fake.unsidelined for g in call) == ["b", "c"]
    assert result["quiescent"] is True
    assert result["unsidelined_groups"] == 2
    assert result["undelivered_at_end"] == 0


async def test_a_failed_group_holding_only_an_unacknowledged_record_is_unsidelined(
    tmp_path: Path,
) -> None:
    # Given everything acknowledged is delivered, but group b holds the unacknowledged b1
    write_producer_journal(tmp_path / "producer.journal", [("a1", "a", True), ("b1", "b", False)])
    fake = FakeSubscription(tmp_path / "receiver.journal", {"b": ["b1"]})
    fake.deliver("a1", "a")
    # When the drain runs
    result = await run_drain(fake, tmp_path, timeout_s=5.0)
    # Then it still finds and unsidelines b before calling the run quiescent
    assert fake.unsidelined == [["b"]]
    assert result["quiescent"] is True


async def test_gives_up_at_the_deadline_and_leaves_the_verdict_to_the_checker(
    tmp_path: Path,
) -> None:
    # Given an acknowledged message that never arrives and no failed group to explain it
    write_producer_journal(tmp_path / "producer.journal", [("a1", "a", True)])
    fake = FakeSubscription(tmp_path / "receiver.journal", {})
    # When the drain runs
    result = await run_drain(fake, tmp_path, timeout_s=0.3)
    # Then it stops at its deadline and reports what is missing
    assert result["quiescent"] is False
    assert result["undelivered_at_end"] == 1


async def test_without_a_status_endpoint_quiescence_rests_on_the_journal(tmp_path: Path) -> None:
    write_producer_journal(tmp_path / "producer.journal", [("a1", "a", True)])
    fake = FakeSubscription(tmp_path / "receiver.journal", {"a": ["a1"]}, has_status=False)
    result = await run_drain(fake, tmp_path, timeout_s=5.0)
    assert fake.unsidelined == [["a"]]
    assert result["quiescent"] is True


async def test_each_subscription_of_the_topic_is_drained_on_its_own(tmp_path: Path) -> None:
    # Given two subscriptions of one topic: "hook" got a1 and b1, "other" got a1 and holds
    # b1 in its dead-lettered group b
    write_producer_journal(tmp_path / "producer.journal", [("a1", "a", True), ("b1", "b", True)])
    fake = FakeSubscription(tmp_path / "receiver.journal", {}, others={"other": {"b": ["b1"]}})
    for mid, group in (("a1", "a"), ("b1", "b")):
        fake.deliver(mid, group)
    fake.deliver("a1", "a", "other")
    # When the drain runs over both
    result = await run_drain(fake, tmp_path, timeout_s=5.0, subscriptions=("hook", "other"))
    # Then only the second subscription's group was unsidelined, and the run is quiet
    assert fake.unsidelined_by == {"other": ["b"]}
    assert result["quiescent"] is True
    assert result["undelivered_at_end"] == 0


async def test_a_subscription_that_got_nothing_keeps_the_drain_from_quiescence(
    tmp_path: Path,
) -> None:
    # Given a1 delivered to "hook" and never to "other", which reports no failed group
    write_producer_journal(tmp_path / "producer.journal", [("a1", "a", True)])
    fake = FakeSubscription(tmp_path / "receiver.journal", {})
    fake.deliver("a1", "a")
    # When the drain runs over both
    result = await run_drain(fake, tmp_path, timeout_s=0.3, subscriptions=("hook", "other"))
    # Then it is not quiescent, and the message missing at "other" is counted
    assert result["quiescent"] is False
    assert result["undelivered_at_end"] == 1


def many_parked(tmp_path: Path) -> tuple[list[str], FakeSubscription]:
    """25 groups of one acknowledged message each, all parked at the first subscription."""
    groups = [f"g{n}" for n in range(25)]
    write_producer_journal(tmp_path / "producer.journal", [(f"{g}-1", g, True) for g in groups])
    return groups, FakeSubscription(tmp_path / "receiver.journal", {g: [f"{g}-1"] for g in groups})


async def test_one_of_many_subscriptions_with_many_groups_missing_is_unsidelined_by_time(
    tmp_path: Path,
) -> None:
    # Given two subscriptions, one with more parked groups than the drain looks up one by one
    groups, fake = many_parked(tmp_path)
    for group in groups:
        fake.deliver(f"{group}-1", group, "other")
    # When the drain runs
    result = await run_drain(fake, tmp_path, timeout_s=5.0, subscriptions=("hook", "other"))
    # Then one call unsidelined them all, without looking each group up
    assert [sorted(call) for call in fake.unsidelined] == [sorted(groups)]
    assert fake.group_lookups == 0
    assert result["quiescent"] is True


async def test_a_single_subscription_still_has_its_groups_looked_up_and_counted(
    tmp_path: Path,
) -> None:
    _, fake = many_parked(tmp_path)
    result = await run_drain(fake, tmp_path, timeout_s=5.0)
    assert result["unsidelined_groups"] == 25 and result["quiescent"] is True
