"""The crash test: a replayable producer, a durable webhook receiver, a chaos loop and a checker.

Each part runs as its own process so that killing Setu's components never kills the witnesses:

- :mod:`bench.crash.producer` publishes small unique records over many groups, retries each one
  until a 2xx and resumes after its own restart from its log and ``GET .../producers/{id}``;
- :mod:`bench.crash.receiver` is the webhook: it appends every call to an fsynced log, fails
  chosen groups with 503 for time windows and rejects a few chosen messages with 4xx;
- :mod:`bench.crash.chaos` SIGKILLs and restarts Setu's processes at random moments;
- :mod:`bench.crash.checker` is a pure function from the two logs to a report.

:mod:`bench.crash.run` wires them to a Setu stack; ``python -m bench.crash`` is the long form and
``tests/crash`` the short one.
"""
