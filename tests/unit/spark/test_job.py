"""The ingest job's Spark settings, as chosen from Setu's."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from py4j.protocol import Py4JNetworkError

from setu.settings import Settings
from spark import job, operator_job
from spark.job import (
    LOCAL_CHECKPOINT_FILE_MANAGER,
    CheckpointLayoutError,
    check_checkpoint,
    is_local_path,
    poll_records,
    session_config,
    source_options,
)

MANAGER = "spark.sql.streaming.checkpointFileManagerClass"


@pytest.mark.parametrize(
    ("path", "local"),
    [
        ("/var/lib/setu/checkpoint", True),
        ("relative/checkpoint", True),
        ("file:///var/lib/setu/checkpoint", True),
        ("hdfs://namenode:8020/setu/checkpoint", False),
        ("s3a://bucket/setu/checkpoint", False),
    ],
)
def test_only_plain_paths_and_file_uris_are_local(path: str, local: bool) -> None:
    assert is_local_path(path) is local


def test_a_local_checkpoint_is_written_without_forking_per_file(tmp_path: Path) -> None:
    # Given a checkpoint on the local disk (the default, inside the data dir)
    conf = session_config(Settings(data_dir=tmp_path))
    # Then the rename-in-place file manager is used
    assert conf[MANAGER] == LOCAL_CHECKPOINT_FILE_MANAGER


def test_a_remote_checkpoint_keeps_spark_default_file_manager() -> None:
    # Given a checkpoint on HDFS, where only the default manager renames atomically
    conf = session_config(Settings(spark_checkpoint_dir="hdfs://nn:8020/setu/checkpoint"))
    # Then Spark's default stays
    assert MANAGER not in conf


def test_on_a_cluster_spark_conf_has_the_last_word_and_no_python_is_shipped() -> None:
    conf = session_config(
        Settings(
            spark_master="spark://master:7077",
            spark_conf={"spark.executor.memory": "4g", "spark.sql.shuffle.partitions": "8"},
        )
    )
    assert conf["spark.executor.memory"] == "4g"
    assert conf["spark.sql.shuffle.partitions"] == "8"
    # (every step of the query runs on the JVM: the executors need no Python)
    assert "spark.pyspark.python" not in conf


@pytest.mark.parametrize(("max_message_bytes", "records"), [(1024 * 1024, 30), (1024, 500)])
def test_a_poll_of_the_source_holds_a_bounded_number_of_bytes(
    max_message_bytes: int, records: int
) -> None:
    # Given records up to the message limit, then one poll holds at most about 32 MiB of them
    # decompressed, however well they compressed
    options = source_options(
        Settings(kafka_bootstrap="k:9092", max_message_bytes=max_message_bytes)
    )
    assert int(options["kafka.max.poll.records"]) == records == poll_records(max_message_bytes)


def state_metadata(checkpoint: Path, operator: str, version: int = 1) -> None:
    """A state metadata file as Spark writes it into a checkpoint: format v1 in one file;
    v2 (transformWithState operators) in one file per batch."""
    folder = checkpoint / "state" / "0" / "_metadata"
    info = {"operatorInfo": {"operatorId": 0, "operatorName": operator}, "stateStoreInfo": []}
    if version == 2:
        folder = folder / "v2"
    folder.mkdir(parents=True)
    for name in ["metadata"] if version == 1 else ["9", "10"]:
        (folder / name).write_text(f"v{version}\n" + json.dumps(info))


def test_a_checkpoint_of_this_job_or_none_yet_is_accepted(tmp_path: Path) -> None:
    check_checkpoint(str(tmp_path / "new"))
    (tmp_path / "ours" / "dedup" / "setu.p.t.ingest" / "0").mkdir(parents=True)
    (tmp_path / "ours" / "commits").mkdir()
    check_checkpoint(str(tmp_path / "ours"))
    check_checkpoint(f"file://{tmp_path / 'ours'}")


@pytest.mark.parametrize(
    ("operator", "version"),
    [("applyInPandasWithState", 1), ("transformWithStateInPandasExec", 2)],
)
def test_a_checkpoint_of_an_earlier_layout_is_refused_with_what_to_do(
    tmp_path: Path, operator: str, version: int
) -> None:
    # Given a checkpoint whose marks an earlier job kept in Spark's state store
    state_metadata(tmp_path, operator, version=version)
    # When the job checks it, then it refuses, naming the operator and the way out
    with pytest.raises(CheckpointLayoutError, match=rf"{operator}.*remove"):
        check_checkpoint(str(tmp_path))


def test_an_unreadable_state_metadata_file_is_reported(tmp_path: Path) -> None:
    folder = tmp_path / "state" / "0" / "_metadata"
    folder.mkdir(parents=True)
    (folder / "metadata").write_text("v1\n{not json")
    with pytest.raises(CheckpointLayoutError, match="cannot read"):
        check_checkpoint(str(tmp_path))


class FakeQuery:
    """A query that fails (awaitTermination raises) or runs until stopped."""

    def __init__(self, fails: bool, wrote: list[int]) -> None:
        self.fails = fails
        self.isActive = True
        self.lastProgress = None
        self.status = {"isTriggerActive": False}
        self._wrote = wrote

    def awaitTermination(self, timeout: float) -> None:  # noqa: N802 (Spark's name)
        if self.fails:
            self.isActive = False
            raise RuntimeError("org.apache.kafka.common.errors.TimeoutException: broker away")

    def stop(self) -> None:
        self.isActive = False

    def exception(self) -> Exception | None:
        return None


class EndsBetweenLooks(FakeQuery):
    """A query that fails right after ``awaitTermination`` timed out: the next look at
    ``isActive`` finds it ended, and ``exception()`` says why."""

    def awaitTermination(self, timeout: float) -> None:  # noqa: N802 (Spark's name)
        self.isActive = False

    def exception(self) -> Exception | None:
        return RuntimeError("Lost executor 3: worker lost")


class Reporter:
    def __init__(self) -> None:
        self.states: list[tuple[str, str | None]] = []

    def set_state(self, state: str, error: str | None = None) -> None:
        self.states.append((state, error))

    def watch(self, progress: object, reading: object = None) -> None:
        pass


def test_a_failed_query_is_started_again_in_the_same_process() -> None:
    # Given a query that fails twice (a broker restarting), then runs
    stopping = threading.Event()
    plan = [True, True, False]
    started: list[FakeQuery] = []

    def start_query() -> FakeQuery:
        query = FakeQuery(plan.pop(0), [])
        if not query.fails:
            stopping.set()  # runs until the job is asked to stop
        started.append(query)
        return query

    reporter = Reporter()
    # When the job runs it
    job.keep_running(start_query, stopping, reporter, lambda: 0, backoff=lambda n: 0.0)  # type: ignore[arg-type]
    # Then it was started three times, each failure reported with its root cause
    assert len(started) == 3
    failed = [error for state, error in reporter.states if state == "failed"]
    assert failed == ["org.apache.kafka.common.errors.TimeoutException: broker away"] * 2


def test_a_query_that_fails_between_two_looks_is_started_again_not_taken_for_the_end() -> None:
    # Given a query that fails just after a wait timed out, then one that runs
    stopping = threading.Event()
    started: list[FakeQuery] = []

    def start_query() -> FakeQuery:
        if started:
            stopping.set()  # the second runs until the job is asked to stop
            query = FakeQuery(False, [])
        else:
            query = EndsBetweenLooks(False, [])
        started.append(query)
        return query

    reporter = Reporter()
    # When the job runs it
    job.keep_running(start_query, stopping, reporter, lambda: 0, backoff=lambda n: 0.0)  # type: ignore[arg-type]
    # Then the failure is reported and the query started again (the job did not just return)
    assert len(started) == 2
    assert ("failed", "Lost executor 3: worker lost") in reporter.states


def test_a_start_that_fails_is_retried_like_a_failed_query() -> None:
    # Given a cluster whose executors are not back yet at the first start
    stopping = threading.Event()
    attempts: list[int] = []

    def start_query() -> FakeQuery:
        attempts.append(1)
        if len(attempts) == 1:
            raise RuntimeError("real-time mode needs 8 task slots, the executors have 2 cores")
        stopping.set()
        return FakeQuery(False, [])

    reporter = Reporter()
    job.keep_running(start_query, stopping, reporter, lambda: 0, backoff=lambda n: 0.0)  # type: ignore[arg-type]
    # Then the start is tried again, the failure reported, and the job goes on
    assert len(attempts) == 2
    assert reporter.states[0][0] == "failed"


def test_a_local_master_short_of_slots_is_left_to_the_caller() -> None:
    def start_query() -> FakeQuery:
        raise operator_job.SlotsShort(6, 8, 2)

    with pytest.raises(operator_job.SlotsShort):
        job.keep_running(  # type: ignore[arg-type]
            start_query, threading.Event(), Reporter(), lambda: 0, backoff=lambda n: 0.0
        )


def test_a_query_that_keeps_failing_without_a_batch_ends_the_job() -> None:
    starts = []

    def start_query() -> FakeQuery:
        starts.append(1)
        return FakeQuery(True, [])

    with pytest.raises(RuntimeError, match="broker away"):
        job.keep_running(  # type: ignore[arg-type]
            start_query, threading.Event(), Reporter(), lambda: 0, backoff=lambda n: 0.0
        )
    assert len(starts) == job.QUERY_RESTARTS + 1


def test_a_dead_jvm_ends_the_job_at_once() -> None:
    # The ingest pod's JVM was killed for memory: every later start failed the same way, and
    # the job went on starting queries for five minutes, serving nothing
    starts = []

    def start_query() -> FakeQuery:
        starts.append(1)
        try:
            raise ConnectionRefusedError(111, "Connection refused")
        except ConnectionRefusedError as refused:
            raise Py4JNetworkError("An error occurred while trying to connect") from refused

    with pytest.raises(Py4JNetworkError):
        job.keep_running(  # type: ignore[arg-type]
            start_query, threading.Event(), Reporter(), lambda: 0, backoff=lambda n: 0.0
        )
    assert len(starts) == 1


class LosesExecutors(FakeQuery):
    """A query of a cluster whose workers keep dying: every run ends with an executor lost."""

    def awaitTermination(self, timeout: float) -> None:  # noqa: N802 (Spark's name)
        self.isActive = False
        raise RuntimeError(
            "Job aborted due to stage failure: Task 5 in stage 18.0 failed 1 times, most recent "
            "failure: Lost task 5.0 (TID 77) (127.0.0.1 executor 16): ExecutorLostFailure "
            "(executor 16 exited unrelated to the running tasks) Reason: worker lost"
        )


def test_a_cluster_losing_workers_faster_than_a_batch_commits_never_ends_the_job() -> None:
    # Given a query that fails with a lost executor many more times than the job stands for
    # standing failures, and then runs
    stopping = threading.Event()
    runs = job.QUERY_RESTARTS * 3

    def start_query() -> FakeQuery:
        nonlocal runs
        runs -= 1
        if runs > 0:
            return LosesExecutors(False, [])
        stopping.set()
        return FakeQuery(False, [])

    # When the job runs it, Then it keeps starting it again until it runs
    job.keep_running(start_query, stopping, Reporter(), lambda: 0, backoff=lambda n: 0.0)  # type: ignore[arg-type]
    assert runs == 0


def test_a_query_whose_topics_changed_is_stopped_and_started_again() -> None:
    # Given a running query, and the topics it read at its start changing once
    stopping = threading.Event()
    started: list[FakeQuery] = []
    changes = [False, True, False]

    def start_query() -> FakeQuery:
        query = FakeQuery(False, [])
        started.append(query)
        return query

    def stale() -> bool:
        changed = changes.pop(0) if changes else False
        if not changes:
            stopping.set()  # the job is asked to stop once the restart was seen
        return changed

    # When the job runs it
    job.keep_running(  # type: ignore[arg-type]
        start_query, stopping, Reporter(), lambda: 0, backoff=lambda n: 0.0, stale=stale
    )
    # Then the first query was stopped and a second started, with no failure reported
    assert len(started) == 2
    assert not started[0].isActive
