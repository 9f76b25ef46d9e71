"""Delivery workers: per-group ordered webhook dispatch, retry tiers and dead letters.

How the modules fit (outside in):

- ``worker``: ``setu deliver``, the composition root. Lists subscriptions every
  ``subscription_refresh_ms`` and keeps one ``runner`` per running or paused subscription;
  heartbeat for ``--check``; the operational ``events`` sink and notifier; SIGTERM.
- ``runner``: one subscription on this worker, a small coordinator. A consumer
  (``kafka_io.ConsumerThread``, range assignor) reads the main log, the retry tiers and the
  DLQ; each assigned partition index gets an ``engine`` and its ``effects`` (calls via
  ``dispatcher``, ``webhook`` and ``http``; copies via ``kafka_io.AsyncProducer``; state via
  ``writer`` into ``state.groups``). Its parts: ``flow`` (pauses, holds, seeks,
  back-pressure), ``commits`` (what is safe to commit, and the housekeeping after it),
  ``guards`` (the subscription's ``breaker``, ``autopause`` and share of ``max_in_flight``,
  with ``ratelimit``), ``reporting`` (figures, reports to the API, stop confirmations);
  ``parts`` is what the composition root hands it. ``attempts`` records each call and move
  for the operator's views; ``metrics``.
- ``takeover``: what happens when a partition index is assigned: claiming it
  (``setu.ordering.fencing``), which rebuilds Redis from the group-state changelog
  (``changelog``, ``state.durable_groups``), ``recovery`` of cut-short state changes, loading
  state, an operator's seek, revisiting released dead letters; ``replays`` skips main records
  a replayed ingest batch wrote twice.
- ``scheduling``: messages scheduled for later (docs/scheduling.md): a held head read back
  from the main log when due, and its producer's cancel looked up.
- ``replaying``: an operator's replay of a window (docs/replays.md), a lane per replay and
  owned partition beside the engine, reading the main log with the worker's group-less
  reader and calling through the subscription's dispatcher.
- ``engine``: the synchronous decision core of one partition index, pure apart from its
  ``Effects`` port, on the ordering model in ``setu/ordering/`` (group state machine, tiers,
  records, dead letters, fencing) and ``backoff``; the call's verdict is ``setu.outcome``, its
  signature ``setu.signing``.

The Kafka reads outside the consumer group (tails, watermarks, backlogs, dead letters) are
``state.kafka_reader``; every Redis command is in ``state/`` (docs/design.md §6, "Boundaries").

Where the mechanism goes beyond docs/design.md §4's suggestion, and why:

1. *Per-tier counts instead of one parked count.* A group's state counts its unfinished
   messages per tier. With a single count and "park in the head's tier", a main message that
   arrives after the head moved up would overtake messages still left in the lower tier. The
   rule that keeps order is "older messages sit in higher (or equal) tiers": new messages park
   in the group's lowest non-empty tier, leftovers move up to the next non-empty tier.
2. *Recovery by reading tails.* Kafka is written before Redis, so a crash can leave a copy
   whose state change is missing. Every copy names its origin (tier, offset); on takeover the
   worker reads each retry tier and the DLQ from its committed offset and completes changes
   whose origin has no recorded outcome. Without this, the replayed source would be copied a
   second time (a duplicate call, and a count that no longer matches).
3. *A recorded outcome for every finished record, not only 2xx.* Replays skip a record whose
   (tier, offset) is in the partition's outcome set; moves record it atomically with the state
   change, 2xx outcomes are batched and always flushed before any state change (so a failed
   group's state never outlives an earlier delivery's record).
4. *Unsideline in place, failures on a lap.* A released group's dead letters are delivered
   from the DLQ where they are, in order, by the worker that owns the partition (one writer
   per group). Copying them all back to a retry tier would put old messages below newer ones
   still on their way up. A released letter that fails again with a retryable status goes
   through the retry tiers again as an operator expects, with its attempt count going on: a
   single letter as a loose copy that ends up a new dead letter, a group's head on a *lap*
   (``groups``): only its copy travels, the letter and everything behind it stay counted in
   the DLQ, so delivered it releases the rest, failed in the last tier it parks the group on
   the same letter again (the latest attempts, status and reason are kept in the group's
   state, shown by DLQ browsing and ``GET .../groups/{g}`` says ``retrying`` in the lap's
   tier meanwhile).
5. *Retry tiers held by pause-and-seek.* A record not yet due pauses its tier partition and
   seeks back to itself; a marker posted after the seek tells the engine when records of that
   partition are current again (records fetched before the seek are ignored).
6. *Fencing a stalled worker* (``fencing``). Kafka gives a partition to one consumer at a
   time, but a worker that stalled past its session timeout carries on until its next poll.
   Each takeover bumps a per-(subscription, partition) owner epoch in Redis; every Redis
   write names its epoch and the Lua script refuses the whole call once the epoch moved on
   (the runner then starts afresh). Copies in Kafka carry their epoch, and each takeover
   records where the tiers ended after bumping it: a copy of an older epoch beyond a later
   fence is a stale worker's and is skipped. A runner also stops calling, copying and
   writing for a partition as soon as it is revoked or lost. A webhook call cannot be
   fenced: one the stale worker makes before it notices is at most a repeat, since each
   worker calls a group's message only after the earlier ones were delivered.
   (Transactional producers with a transactional id per partition would fence Kafka writes
   at the broker instead, at the price of a producer per partition, a transaction per batch
   of copies and read_committed bookkeeping around transaction markers in lag and tail
   reads.)
7. *Dead letters delivered again are not remembered one by one.* Which of a group's letters
   are live follows from its state (parked in the DLQ from ``dlq_from`` on); only single
   letters delivered again need an entry, kept in a sorted set by offset and forgotten once
   retention removed the letter (below the DLQ's first offset). Forgetting them any earlier,
   say at the commit, would show delivered letters again and let an unsideline deliver them
   twice.
8. *Main-log records the ingest job wrote twice* (``replays``). A crash of the ingest job
   between its Kafka write and its batch commit writes the batch again, right after itself:
   same messages, new main offsets, so recorded outcomes do not catch them. Each main record
   carries its ingest partition and offset, which only grow within a main partition except
   in such a replay; a record not above the highest already read is skipped. The highs of the
   records below a committed main offset travel as that commit's metadata, so a successor
   knows them too.
9. *Each message's own retry budget* (``tiers.after_failure``, docs/delivery.md). A message
   that waited behind its group in a high tier and became the head there gets N+1 attempts
   of its own: while its attempts have not outgrown the tier it waits where it is (in
   memory, its attempts and due time in the group's state), since moving it down would put
   it below newer messages of its group.
10. *Redis as a view of a changelog* (docs/decisions/0007-group-state-changelog.md). Every
   state change goes first to a compacted Kafka topic per subscription; each takeover rebuilds
   Redis from it, and a worker that finds Redis behind what it wrote takes its partitions over
   again. Failed groups carry done marks per tier, since recorded outcomes stay in Redis only:
   a record read again after Redis forgot its outcome is recognised by its group's mark.
11. *A scheduled head held by reference* (docs/decisions/0013-scheduled-heads-held-by-reference.md).
   A healthy group's message scheduled for later becomes its head where it is, in the main
   log: its offset and time in the group's state (``held``, counted in tier 1, so the group's
   later messages park in tier 1 behind it and the order rule holds unchanged); the main
   log's commit moves on; the engine reads it back when due (``Effects.recall``).
"""
