"""Pauses with reasons and back-pressure (delivery/flow.py); seeks and holds are tested
through the runner (tests/unit/delivery/test_runner.py)."""

from __future__ import annotations

from confluent_kafka import TopicPartition

from delivery.flow import HOLD, PAUSED, PartitionFlow
from setu.ordering.tiers import MAIN
from tests.consumers import ConsumerStub

TOPICS = {MAIN: "main", 1: "rq.1"}


class Kafka:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, int]] = []

    def pause(self, partitions: list[TopicPartition]) -> None:
        self.calls += [("pause", tp.topic, tp.partition) for tp in partitions]

    def resume(self, partitions: list[TopicPartition]) -> None:
        self.calls += [("resume", tp.topic, tp.partition) for tp in partitions]


class Engine:
    def __init__(self) -> None:
        self.open: dict[int, int] = {}

    def open_count(self, tier: int) -> int:
        return self.open.get(tier, 0)


class Port:
    def __init__(self, partition: int) -> None:
        self.partition, self.engine, self.alive = partition, Engine(), True


def flow(ports: dict[int, Port], limit: int = 100) -> tuple[PartitionFlow, Kafka, ConsumerStub]:
    kafka = Kafka()
    consumer = ConsumerStub(kafka)
    made = PartitionFlow(consumer, TOPICS, ports, lambda: limit)  # type: ignore[arg-type]
    return made, kafka, consumer


async def test_a_tier_partition_pauses_at_its_first_reason_and_resumes_when_none_is_left() -> None:
    made, kafka, _ = flow({0: Port(0)})
    made.reason(0, 1, HOLD, True)
    made.reason(0, 1, PAUSED, True)
    made.reason(0, 1, HOLD, False)
    assert kafka.calls == [("pause", "rq.1", 0)]
    made.reason(0, 1, PAUSED, False)
    assert kafka.calls == [("pause", "rq.1", 0), ("resume", "rq.1", 0)]


async def test_a_partition_taken_over_while_paused_starts_paused_and_forgets_old_reasons() -> None:
    made, _, _ = flow({0: Port(0)})
    made.reason(0, MAIN, HOLD, True)
    made.assigned(0, [MAIN, 1], paused=True)
    assert {(tp.topic, tp.partition) for tp in made.paused_at_start([0])} == {
        ("main", 0),
        ("rq.1", 0),
    }
    made.assigned(0, [MAIN, 1], paused=False)
    assert made.paused_at_start([0]) == []


async def test_a_slow_partition_holding_most_of_the_budget_is_paused_while_others_flow() -> None:
    slow, quick = Port(0), Port(1)
    made, kafka, consumer = flow({0: slow, 1: quick}, limit=100)
    # When one tier partition holds more than 3/4 of the budget
    slow.engine.open[MAIN] = 80
    made.balance()
    # Then it alone is paused, and consuming goes on
    assert kafka.calls == [("pause", "main", 0)]
    assert consumer.flowing.is_set()
    # And once it worked its records down below 1/4, it is resumed
    slow.engine.open[MAIN] = 20
    made.balance()
    assert kafka.calls[-1] == ("resume", "main", 0)
    # And so is one held back that empties at once (balancing skips a runner with nothing in
    # memory, not one holding a partition back)
    slow.engine.open[MAIN] = 80
    made.balance()
    slow.engine.open[MAIN] = 0
    made.balance()
    assert kafka.calls[-2:] == [("pause", "main", 0), ("resume", "main", 0)]


async def test_consuming_stops_when_full_and_starts_again_below_three_quarters() -> None:
    port = Port(0)
    made, _, consumer = flow({0: port}, limit=100)
    port.engine.open[MAIN] = 120
    made.regulate()
    assert not consumer.flowing.is_set()
    port.engine.open[MAIN] = 70
    made.regulate()
    assert consumer.flowing.is_set()
