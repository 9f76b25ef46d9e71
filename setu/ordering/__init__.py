"""The ordering model: pure rules, no I/O, no adapter (docs/design.md §3, §4).

- :mod:`setu.ordering.tiers`: tier numbers and where a failed message goes next.
- :mod:`setu.ordering.state`: a failed group's state and the writes that change it.
- :mod:`setu.ordering.groups`: the group state machine (park, forward, laps, release).
- :mod:`setu.ordering.dead_letters`: which dead letters an operator's request selects.
- :mod:`setu.ordering.records`: what delivery reads from a Kafka record.
- :mod:`setu.ordering.fencing`: which copies a worker that lost its partition wrote.

``delivery/`` runs it against Kafka and webhooks, ``state/`` stores it, ``api/`` shows it.
"""
