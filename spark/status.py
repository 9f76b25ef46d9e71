"""Reports the ingest job's state for the API and ``setu dev up``
(:mod:`state.ingest_status` says what is written and how it is read)."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Collection, Mapping
from typing import Any

import redis

from setu.clock import now_ms
from spark.metrics import offsets_behind
from state.ingest_status import IngestStatus

log = logging.getLogger(__name__)

Progress = Callable[[], "tuple[bool, Mapping[str, Any] | None]"]
Reading = Callable[[], "Collection[str] | None"]


def topic_lags(progress: Mapping[str, Any] | None) -> dict[str, int] | None:
    """Per ingest topic, the records after the last batch's end (``latestOffset`` minus
    ``endOffset`` of each partition, from a progress report); None without a report."""
    if not progress:
        return None
    lags: dict[str, int] = {}
    for source in progress.get("sources") or ():
        ends, latest = _offsets(source.get("endOffset")), _offsets(source.get("latestOffset"))
        for topic, partitions in latest.items():
            done = ends.get(topic, {})
            lags[topic] = lags.get(topic, 0) + sum(
                max(0, int(offset) - int(done.get(partition, 0)))
                for partition, offset in partitions.items()
            )
    return lags


def _offsets(value: Any) -> dict[str, dict[str, int]]:
    """A source's offsets: a JSON string or object of topic -> partition -> offset."""
    if isinstance(value, str):
        value = json.loads(value)
    return value if isinstance(value, dict) else {}


class StatusReporter:
    """Writes the job's state at each change and a heartbeat every ``interval_s``."""

    def __init__(
        self,
        store: IngestStatus,
        last_batch_at: Callable[[], float | None],
        interval_s: float = 2.0,
    ) -> None:
        self._store = store
        self._last_batch_at = last_batch_at
        self._interval_s = interval_s
        self._progress: Progress = lambda: (False, None)
        self._reading: Reading = lambda: None
        self._state = ""
        # Whether a failure may be shown (one from before this process too), and the last
        # batch time when it happened: a batch written after it clears it (see _run).
        self._error_shown = True
        self._failed_after: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ingest-status", daemon=True)

    def start(self) -> StatusReporter:
        self.set_state("starting")  # a failure before this start stays shown until a batch
        self._thread.start()
        return self

    def watch(self, progress: Progress, reading: Reading = lambda: None) -> None:
        """The running query: its state, lag and the ingest topics it reads (``reading``, or
        where that says None, the topics of its last progress) are reported from now on."""
        self._progress = progress
        self._reading = reading

    def set_state(self, state: str, error: str | None = None) -> None:
        """Records ``state`` now (``error`` "" clears the last failure, None keeps it)."""
        fields = self._changed(state)
        if error is not None:
            fields["error"] = error
            self._error_shown = bool(error)
            self._failed_after = self._last_batch_at()
        self._write(fields)

    def stop(self, state: str = "stopped") -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.set_state(state)

    def _changed(self, state: str) -> dict[str, str | int]:
        """The fields that record ``state`` now, with ``since`` when it is a new one."""
        fields: dict[str, str | int] = {"state": state, "at": now_ms()}
        if state != self._state:
            fields["since"] = now_ms()
            self._state = state
        return fields

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.beat()

    def beat(self) -> None:
        """One heartbeat, with the query's state and lag (the thread's, every interval_s)."""
        try:
            active, progress = self._progress()
        except Exception:  # the JVM is going away
            active, progress = False, None
        if self._state not in ("starting", "running"):
            return  # failed or stopped: written when it happened
        fields = self._changed("running" if active else self._state)
        behind = offsets_behind(progress)
        if behind is not None:
            fields["behind"] = int(behind)
        lags = topic_lags(progress)
        if lags is not None:
            fields["lags"] = json.dumps(lags, sort_keys=True)
        reading = self._reading()
        if reading is None:
            reading = lags
        if reading is not None and active:
            fields["reading"] = json.dumps(sorted(reading))
        last = self._last_batch_at()
        if last is not None:
            fields["last_batch"] = int(last * 1000)
            if self._error_shown and last != self._failed_after:
                fields["error"] = ""  # a batch was written since the last failure
                self._error_shown = False
        self._write(fields)

    def _write(self, fields: Mapping[str, str | int]) -> None:
        try:
            self._store.write(fields)
        except redis.RedisError as exc:  # reported again on the next beat
            log.warning("could not report the ingest job's state: %s", exc)
