"""The delivery worker's Prometheus metrics: counters, live gauges and the /metrics server."""

from __future__ import annotations

import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from delivery.metrics import DeliveryMetrics, RunnerFigures
from setu.envelope import Envelope
from setu.ordering.groups import Kind
from setu.ordering.records import Record
from setu.ordering.state import Fenced
from setu.outcome import Outcome, Verdict


def samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text.decode()):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def of(**labels: str) -> tuple[tuple[str, str], ...]:
    """The labels of one of the subscription's samples, as :func:`samples` keys them."""
    return tuple(sorted({"project": "shop", "subscription": "billing", **labels}.items()))


SUB = of()


def test_failures_are_counted_per_subscription() -> None:
    # Given a subscription's counters
    metrics = DeliveryMetrics()
    sub = metrics.subscription("shop", "billing")
    # When calls end each way, copies are written, a group parks again, a stalled worker's
    # copies are skipped and the runner is fenced out
    sub.call(Outcome(Verdict.DELIVERED, status=200), 0.01)
    sub.call(Outcome(Verdict.RETRY, status=503), 0.02)
    sub.call(Outcome(Verdict.DEAD_LETTER, status=400), 0.03)
    sub.moved("rq.1", "head", 1)
    sub.moved("dlq", "park", 3)
    sub.reparked()
    sub.stale_copies(2)
    sub.failed(Fenced([1], "FENCED 1=7"))
    # Then each is visible, labelled by subscription
    got = samples(metrics.render())
    for result in ("delivered", "retry", "dead_letter"):
        assert got[("setu_delivery_calls_total", of(result=result))] == 1
    assert got[("setu_delivery_call_duration_seconds_count", SUB)] == 3
    assert got[("setu_delivery_call_duration_seconds_bucket", of(le="0.01"))] == 1
    assert got[("setu_delivery_call_duration_seconds_bucket", of(le="0.025"))] == 2
    assert got[("setu_delivery_call_duration_seconds_bucket", of(le="+Inf"))] == 3
    assert round(got[("setu_delivery_call_duration_seconds_sum", SUB)], 6) == 0.06
    assert got[("setu_delivery_moves_total", of(kind="park", tier="dlq"))] == 3
    assert got[("setu_delivery_reparked_total", SUB)] == 1
    assert got[("setu_delivery_stale_copies_total", SUB)] == 2
    assert got[("setu_delivery_runner_failures_total", of(error="Fenced"))] == 1
    # And a restarted runner of the subscription counts on from there
    assert metrics.subscription("shop", "billing") is sub


def test_latency_is_split_into_wait_dispatch_and_end_to_end() -> None:
    # Given a message produced at 1,000 ms and read from the main log at 1,300 ms
    metrics = DeliveryMetrics()
    sub = metrics.subscription("shop", "billing")
    envelope = Envelope("m1", b"x", produced_at_ms=1_000)
    record = Record(0, 5, envelope, read_ms=1_300)
    sub.main_wait_seconds.observe(0.25)
    # When its first call, sent at 1,350 ms, answers 200 at 1,400 ms, and a retry of a copy
    # (attempt 2) answers 503 at 9,000 ms
    sub.timed(record, 1, Outcome(Verdict.DELIVERED, status=200), 0.05, 1_400)
    retry = Record(1, 2, envelope, kind=Kind.RETRY, read_ms=8_000)
    sub.timed(retry, 2, Outcome(Verdict.RETRY, status=503), 0.01, 9_000)
    # Then the wait, the 50 ms dispatch of the first call and the 400 ms from produce to 2xx
    # are in their histograms; the retry's failed call adds to neither
    got = samples(metrics.render())
    assert got[("setu_delivery_main_wait_seconds_bucket", of(le="0.3"))] == 1
    assert got[("setu_delivery_dispatch_seconds_count", SUB)] == 1
    assert round(got[("setu_delivery_dispatch_seconds_sum", SUB)], 6) == 0.05
    assert got[("setu_delivery_end_to_end_seconds_count", SUB)] == 1
    assert round(got[("setu_delivery_end_to_end_seconds_sum", SUB)], 6) == 0.4
    assert got[("setu_delivery_end_to_end_seconds_bucket", of(le="0.4"))] == 1
    assert got[("setu_delivery_end_to_end_seconds_bucket", of(le="0.3"))] == 0


def test_live_gauges_come_from_the_runners_at_scrape_time() -> None:
    # Given a worker whose runner owns two partitions with failed groups
    figures = [RunnerFigures("shop", "billing", 2, 5, 40, 7, 3, 1)]
    metrics = DeliveryMetrics()
    metrics.watch(lambda: figures)
    # Then a scrape reads them
    got = samples(metrics.render())
    assert got[("setu_delivery_partitions", SUB)] == 2
    assert got[("setu_delivery_in_flight", SUB)] == 5
    assert got[("setu_delivery_buffered_records", SUB)] == 40
    assert got[("setu_delivery_retry_backlog", SUB)] == 7
    assert got[("setu_delivery_failed_groups", of(state="retrying"))] == 3
    assert got[("setu_delivery_failed_groups", of(state="dead_lettered"))] == 1
    assert got[("setu_delivery_parked_messages", SUB)] == 0
    # And no message is held, so there is no oldest age
    assert ("setu_delivery_oldest_held_age_seconds", SUB) not in got
    # When a group holds a message produced a minute ago
    figures[0] = RunnerFigures(
        "shop", "billing", 2, 5, 40, 7, 3, 1, int(time.time() * 1000) - 60_000, parked=4
    )
    got = samples(metrics.render())
    assert 59 < got[("setu_delivery_oldest_held_age_seconds", SUB)] < 70
    assert got[("setu_delivery_parked_messages", SUB)] == 4


def test_an_engine_knows_the_oldest_message_its_groups_hold() -> None:
    from tests.unit.delivery.sim import World, subscription

    # Given a group with two messages produced at known times, read into memory
    world = World(subscription())
    world.publish("g1", produced_at_ms=1_000)
    world.publish("g1", produced_at_ms=2_000)
    assert world.engine.oldest_held_ms() is None
    while world.poll(0):
        pass
    # Then the engine reports the first one's produce time while it is being called
    assert world.engine.oldest_held_ms() == 1_000
    # And the second's once the first is delivered, and none once both are
    world.respond(0, 200)
    assert world.engine.oldest_held_ms() == 2_000
    world.respond(0, 200)
    assert world.engine.oldest_held_ms() is None


def test_the_worker_serves_its_metrics_over_http() -> None:
    # Given metrics served on a free port
    metrics = DeliveryMetrics()
    metrics.subscription("shop", "billing").reparked()
    server = metrics.serve("127.0.0.1", 0)
    try:
        # When Prometheus scrapes it
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            body = response.read()
        # Then it gets the worker's registry
        assert samples(body)[("setu_delivery_reparked_total", SUB)] == 1
    finally:
        server.shutdown()
        server.server_close()
