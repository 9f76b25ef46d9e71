"""The checker judges hand-made journals: every violation it must catch, every benign case it
must let through."""

from __future__ import annotations

from typing import Any

import pytest

from bench.crash.checker import (
    Call,
    DeadLetter,
    Published,
    calls_from_journal,
    check,
    check_each,
    published_from_journal,
)

# Group "a" publishes a1, a2, a3 and group "b" publishes b1, b2, all acknowledged.
PUBLISHED = [
    Published("a1", "a", "h-a1", True),
    Published("b1", "b", "h-b1", True),
    Published("a2", "a", "h-a2", True),
    Published("a3", "a", "h-a3", True),
    Published("b2", "b", "h-b2", True),
]


def call(mid: str, status: int = 200, **changes: Any) -> Call:
    """A call as Setu should make it for ``mid``, with ``changes`` applied."""
    fields: dict[str, Any] = {
        "message_id": mid,
        "group_id": mid[0],
        "webhook_id": mid,
        "status": status,
        "payload_hash": f"h-{mid}",
        "signature_ok": True,
    }
    fields.update(changes)
    return Call(**fields)


def in_order() -> list[Call]:
    return [call(mid) for mid in ("a1", "b1", "a2", "b2", "a3")]


VIOLATIONS: list[tuple[str, list[Call], dict[str, int]]] = [
    (
        "a message acknowledged but never called is lost",
        [call("a1"), call("b1"), call("a2"), call("b2")],
        {"lost": 1},
    ),
    (
        "a message that only ever got 503 is lost",
        [*in_order()[:4], call("a3", 503), call("a3", 503)],
        {"lost": 1},
    ),
    (
        "a later message delivered first is out of order and early",
        [call("a2"), call("a1"), call("b1"), call("b2"), call("a3")],
        {"out_of_order_groups": 1, "early_calls": 1},
    ),
    (
        "a later message merely attempted before the earlier one's 2xx is early",
        [call("a2", 503), call("a1"), call("a2"), call("b1"), call("b2"), call("a3")],
        {"early_calls": 1},
    ),
    (
        "a later message attempted while the earlier one is dead-lettered is early",
        [call("a1", 422), call("a2", 503), call("a1"), call("a2"), call("a3"), *in_order()[1::2]],
        {"early_calls": 1},
    ),
    (
        "a body that differs from the published one is corrupt",
        [*in_order()[:4], call("a3", payload_hash="h-other")],
        {"corrupt_calls": 1},
    ),
    (
        "a group header that differs from the published group is corrupt",
        [*in_order()[:4], call("a3", group_id="b")],
        {"corrupt_calls": 1},
    ),
    (
        "a corrupt retry counts even when a clean call delivered the message",
        [*in_order(), call("a3", payload_hash="h-other")],
        {"corrupt_calls": 1},
    ),
    (
        "a message id nobody published is unknown",
        [*in_order(), call("z9", group_id="a", payload_hash="h-z9")],
        {"unknown_calls": 1},
    ),
    (
        "a webhook-id that is not the message id is a mismatch",
        [*in_order()[:4], call("a3", webhook_id="a3-x")],
        {"webhook_id_mismatches": 1},
    ),
    (
        "two 2xx calls under different webhook-ids are a duplicate a receiver cannot drop",
        [*in_order(), call("a3", webhook_id="a3-retry")],
        {"webhook_id_mismatches": 1, "id_distinct_duplicates": 1},
    ),
    (
        "a signature that does not verify is counted",
        [*in_order()[:4], call("a3", signature_ok=False)],
        {"bad_signatures": 1},
    ),
]


@pytest.mark.parametrize(
    ("calls", "expected"),
    [case[1:] for case in VIOLATIONS],
    ids=[case[0] for case in VIOLATIONS],
)
def test_violation_is_counted_and_fails_the_run(
    calls: list[Call], expected: dict[str, int]
) -> None:
    # Given the published records and a call journal with one kind of fault
    # When it is checked
    report = check(PUBLISHED, calls)
    # Then exactly that fault is counted, and the run fails on it
    counted = {name: report[name] for name in report["violations"]}
    assert counted == expected
    assert report["ok"] is False


BENIGN: list[tuple[str, list[Published], list[Call], dict[str, int]]] = [
    ("a clean run", PUBLISHED, in_order(), {}),
    (
        "groups interleave freely",
        PUBLISHED,
        [call("b1"), call("b2"), call("a1"), call("a2"), call("a3")],
        {},
    ),
    (
        "a repeated call with the same webhook-id is a raw duplicate only",
        PUBLISHED,
        [*in_order(), call("a1")],
        {"raw_duplicates": 1},
    ),
    (
        "a replay of an earlier message after a later one was delivered is not early",
        PUBLISHED,
        [call("a1"), call("a2"), call("a1"), call("a2"), call("a3"), call("b1"), call("b2")],
        {"raw_duplicates": 2},
    ),
    (
        "retries before the first 2xx are not duplicates",
        PUBLISHED,
        [call("a1", 503), call("a1", 503), *in_order()],
        {},
    ),
    (
        "a dead-lettered message delivered after unsideline, its group behind it",
        PUBLISHED,
        [call("a1", 422), call("b1"), call("b2"), call("a1"), call("a2"), call("a3")],
        {"messages_rejected_4xx": 1},
    ),
    (
        "an unacknowledged message that never arrived is not required",
        [*PUBLISHED, Published("a4", "a", "h-a4", False)],
        in_order(),
        {"optional": 1},
    ),
    (
        "an unacknowledged message that did arrive, in its place, is fine",
        [*PUBLISHED, Published("a4", "a", "h-a4", False)],
        [*in_order(), call("a4")],
        {"optional": 1, "optional_delivered": 1},
    ),
    (
        "a missing unacknowledged message does not hold back its successors",
        [
            Published("a1", "a", "h-a1", True),
            Published("a2", "a", "h-a2", False),
            Published("a3", "a", "h-a3", True),
        ],
        [call("a1"), call("a3")],
        {"optional": 1},
    ),
]


@pytest.mark.parametrize(
    ("published", "calls", "expected"),
    [case[1:] for case in BENIGN],
    ids=[case[0] for case in BENIGN],
)
def test_benign_run_passes(
    published: list[Published], calls: list[Call], expected: dict[str, int]
) -> None:
    # Given a journal with nothing wrong in it
    report = check(published, calls)
    # Then it passes, with the informational counts as expected
    assert report["ok"] is True, report["violations"]
    assert report["violations"] == []
    defaults = {
        "raw_duplicates": 0,
        "optional": 0,
        "optional_delivered": 0,
        "messages_rejected_4xx": 0,
    }
    for name, value in {**defaults, **expected}.items():
        assert report[name] == value, name


def test_an_unacknowledged_message_delivered_after_its_successor_is_out_of_order() -> None:
    # Given a4 sent without acknowledgement, then a5 acknowledged
    published = [
        *PUBLISHED,
        Published("a4", "a", "h-a4", False),
        Published("a5", "a", "h-a5", True),
    ]
    # When a5 is delivered before a4
    report = check(published, [*in_order(), call("a5"), call("a4")])
    # Then the group is out of order: an optional message must still keep its place
    assert report["out_of_order_groups"] == 1
    assert report["examples"]["out_of_order_groups"] == ["a"]


def test_report_counts_and_examples() -> None:
    calls = [call("a1", 503), *in_order()[1:], call("b1")]
    report = check(PUBLISHED, calls)
    assert report["lost"] == 1
    assert report["examples"]["lost"] == ["a1"]
    assert report["examples"]["raw_duplicates"] == {"b1": 1}
    assert report["calls"] == 6
    assert report["calls_by_status"] == {"2xx": 5, "5xx": 1}
    assert report["accepted"] == 5
    assert report["delivered"] == 4
    assert report["groups"] == 2


def test_examples_are_capped() -> None:
    published = [Published(f"m{i}", "m", f"h-m{i}", True) for i in range(50)]
    report = check(published, [])
    assert report["lost"] == 50
    assert len(report["examples"]["lost"]) == 10


def test_published_from_journal_keeps_publish_order_and_marks_acknowledgements() -> None:
    # Given a journal where seq 1 was acked over HTTP, seq 2 confirmed by the server after a
    # restart, and seq 3 sent but never acknowledged
    entries = [
        {"e": "start", "t": 1},
        {"e": "sent", "pid": "p", "seq": 1, "mid": "p-1", "gid": "g1", "hash": "h1"},
        {"e": "ack", "pid": "p", "seq": 1, "via": "http"},
        {"e": "sent", "pid": "p", "seq": 2, "mid": "p-2", "gid": "g2", "hash": "h2"},
        {"e": "start", "t": 2},
        {"e": "ack", "pid": "p", "seq": 2, "via": "server"},
        {"e": "sent", "pid": "p", "seq": 3, "mid": "p-3", "gid": "g1", "hash": "h3"},
        {"e": "start", "t": 3},
    ]
    # Then the records come out in order, the last one optional
    assert published_from_journal(entries) == [
        Published("p-1", "g1", "h1", True),
        Published("p-2", "g2", "h2", True),
        Published("p-3", "g1", "h3", False),
    ]


def test_calls_from_journal_reads_receiver_entries() -> None:
    entries = [
        {
            "t": 1,
            "mid": "m",
            "gid": "g",
            "wid": "m",
            "ts": "1",
            "attempt": "1",
            "status": 503,
            "hash": "h",
            "sig": None,
        },
        {
            "t": 2,
            "mid": "m",
            "gid": "g",
            "wid": "m",
            "ts": "2",
            "attempt": "2",
            "status": 200,
            "hash": "h",
            "sig": True,
        },
    ]
    assert calls_from_journal(entries) == [
        Call("m", "g", "m", 503, "h", None, at_ms=1),
        Call("m", "g", "m", 200, "h", True, at_ms=2),
    ]


def test_a_scheduled_message_called_before_its_time_fails_the_run() -> None:
    # Given a's first message scheduled for t=100: called at 99 (503), then at 150 (200)
    published = [Published("a1", "a", "h", True), Published("a2", "a", "h", True)]
    calls = [
        Call("a1", "a", "a1", 503, "h", at_ms=99, deliver_at_ms=100),
        Call("a1", "a", "a1", 200, "h", at_ms=150, deliver_at_ms=100),
        Call("a2", "a", "a2", 200, "h", at_ms=151),
    ]
    report = check(published, calls)
    # Then the early call is a violation, though everything was delivered in order
    assert report["violations"] == ["calls_before_their_time"]
    assert report["examples"]["calls_before_their_time"] == ["a1"]
    assert report["scheduled_delivered"] == 1
    # And without it the run passes
    assert check(published, calls[1:])["ok"]


def test_a_message_dead_lettered_before_its_own_budget_ran_out_fails_the_run() -> None:
    # Given three retry tiers: a2 failed with 503 after two attempts, a3 after four, and b1
    # was rejected with a 4xx after one; a2 and a3 sit in a flaky group
    dead = [
        DeadLetter("a2", "a", 2, 503, retryable=True),
        DeadLetter("a3", "a", 4, 503, retryable=True),
        DeadLetter("b1", "b", 1, 422, retryable=False),
    ]
    calls = [call(m) for m in ("a1", "b1", "a2", "a3", "b2")]
    # When the run is judged
    report = check(PUBLISHED, calls, dead, retry_tiers=3, flaky_groups=["a"])
    # Then only a2 breaks the rule, and the flaky group's dead letters are reported
    assert report["violations"] == ["short_budget_dead_letters"]
    assert report["short_budget_dead_letters"] == 1
    assert report["examples"]["short_budget_dead_letters"] == ["a2"]
    assert (report["flaky_groups"], report["flaky_messages"]) == (1, 3)
    assert report["flaky_messages_dead_lettered"] == 2


def test_each_subscription_is_judged_on_its_own() -> None:
    # Given three subscriptions of one topic: "hook" got everything in order, "late" got b2
    # before b1, and "empty" got no call at all
    disordered = [call(mid) for mid in ("a1", "b2", "b1", "a2", "a3")]
    # When the run is judged
    report = check_each(PUBLISHED, {"hook": in_order(), "late": disordered, "empty": []}, {})
    # Then each fault is counted where it happened, and what was published is counted once
    assert report["ok"] is False
    assert report["subscriptions"] == 3
    assert report["failing_subscriptions"] == {
        "late": {"out_of_order_groups": 1, "early_calls": 1},
        "empty": {"lost": 5},
    }
    assert (report["lost"], report["out_of_order_groups"]) == (5, 1)
    assert (report["published"], report["accepted"], report["delivered"]) == (5, 5, 10)
    assert report["examples"]["subscription"] == "late"


def test_one_subscription_is_judged_as_before() -> None:
    assert check_each(PUBLISHED, {"hook": in_order()}, {}) == check(PUBLISHED, in_order())
