"""The runner's seeks on the real broker: librdkafka refuses a seek while a partition that was
just assigned from its committed offset is still looking that offset up."""

from __future__ import annotations

import asyncio

import pytest
from confluent_kafka import OFFSET_INVALID, Consumer, KafkaException, TopicPartition

from delivery.effects import PartitionEffects
from delivery.http import HttpClient
from delivery.parts import RunnerConfig, RunnerParts
from delivery.runner import SubscriptionRunner
from delivery.webhook import WebhookSender
from setu import names
from setu.ordering.tiers import DLQ
from state.groups_stub import StubGroupStore
from state.kafka_reader import KafkaReader
from state.workers import StubWorkers
from tests.consumers import ConsumerStub
from tests.integration.delivery.support import Receiver, World
from tests.runners import EngineStub, NoCopies

pytestmark = pytest.mark.integration


class Watched:
    """The consumer, counting the seeks it refused."""

    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer
        self.refused = 0

    def seek(self, tp: TopicPartition) -> None:
        try:
            self.consumer.seek(tp)
        except KafkaException:
            self.refused += 1
            raise


async def test_a_seek_right_after_an_assignment_takes_before_the_engine_reads_on(
    world: World, receiver: Receiver
) -> None:
    # Given a subscription whose DLQ partition 0 holds six records, committed at 4
    topic = world.topic()
    sub = world.subscription(receiver.url)
    world.topics.ensure_subscription(sub, topic)  # its tiers and DLQ, as at a first failure
    dlq = names.dlq_topic(world.project, sub.name)
    group = names.consumer_group(world.project, sub.name)
    for n in range(6):
        world.producer.produce(dlq, value=b"%d" % n, partition=0)
    world.producer.flush(10)
    config = {"bootstrap.servers": world.bootstrap, "group.id": group, "enable.auto.commit": False}
    committer = Consumer(config)
    committer.commit(offsets=[TopicPartition(dlq, 0, 4)], asynchronous=False)
    committer.close()
    # and a runner whose consumer was just assigned that partition from its committed offset
    consumer = Consumer(config)
    watched = Watched(consumer)
    parts = RunnerParts(
        store=StubGroupStore(),
        sender=WebhookSender(sub, HttpClient(allow_private=True)),
        reader=KafkaReader(world.bootstrap),
        copies=NoCopies(),
        reports=StubWorkers(),
        consumer=ConsumerStub(watched).factory,
    )
    runner = SubscriptionRunner(sub, RunnerConfig(bootstrap=world.bootstrap, worker_id="w"), parts)
    port = PartitionEffects(runner.context, 0)
    engine = EngineStub()
    port.engine = engine  # type: ignore[assignment]
    try:
        consumer.assign([TopicPartition(dlq, 0, OFFSET_INVALID)])

        # When the engine asks at once to read the DLQ again from offset 1 (a group released
        # as the partition is taken over)
        runner.flow.seek(port, DLQ, 1)
        await asyncio.wait_for(engine.done.wait(), 30)

        # Then librdkafka refused the first seek, the runner sought again until it took, and
        # the engine was told only then: the consumer reads from 1, not from the commit
        assert watched.refused >= 1
        assert engine.unblocked_at == [(DLQ, 1)]
        first = None
        while first is None:
            for msg in await asyncio.to_thread(consumer.consume, 10, 1.0):
                if msg.error() is None:
                    first = msg.offset()
                    break
        assert first == 1
    finally:
        consumer.close()
