"""The ``setu`` admin commands against a live API (cli/admin.py): tables, --json, files,
produce from JSON lines, and errors that say what to do."""

from __future__ import annotations

import io
import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cli.main import build_parser
from cli.main import main as setu
from tests.integration.api.support import ADMIN_KEY, served_api

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def api_url(
    kafka_bootstrap: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    with served_api(
        tmp_path_factory.mktemp("admin"), kafka_bootstrap=kafka_bootstrap, redis_url=redis_url
    ) as url:
        yield url


@pytest.fixture
def run(api_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Any:
    """Runs ``setu ARGS`` with the API's URL and admin key in the environment; returns
    (exit code, stdout, stderr)."""
    monkeypatch.setenv("SETU_API_URL", api_url)
    monkeypatch.setenv("SETU_API_KEY", ADMIN_KEY)

    def call(*argv: str, stdin: str | None = None) -> tuple[int, str, str]:
        if stdin is not None:
            monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
        code = setu(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    return call


def write(path: Path, data: dict[str, Any]) -> str:
    path.write_text(json.dumps(data))
    return str(path)


def test_resources_are_created_from_files_listed_shown_and_deleted(
    run: Any, tmp_path: Path
) -> None:
    project = f"cli{uuid.uuid4().hex[:8]}"
    # Created from YAML and JSON files
    (tmp_path / "p.yaml").write_text(f"name: {project}\ndescription: made by the CLI\n")
    assert run("projects", "create", "-f", str(tmp_path / "p.yaml"))[0] == 0
    topic = write(tmp_path / "t.json", {"name": "orders", "grouped": True, "partitions": 2})
    assert run("topics", "create", project, "-f", topic)[0] == 0
    sub = write(
        tmp_path / "s.json",
        {"name": "billing", "topic": "orders", "endpoint": {"url": "https://hooks.example.com/b"}},
    )
    assert run("subscriptions", "create", project, "-f", sub)[0] == 0
    # Listed as tables, and as the API's own JSON
    code, table, _ = run("subscriptions", "ls", project)
    assert code == 0 and "billing" in table and "https://hooks.example.com/b" in table
    code, listed, _ = run("subscriptions", "ls", project, "--json")
    assert [s["name"] for s in json.loads(listed)["subscriptions"]] == ["billing"]
    code, shown, _ = run("projects", "show", project, "--json")
    assert json.loads(shown)["description"] == "made by the CLI"
    # Views show times a person reads, never epoch milliseconds
    for argv in (("subscriptions", "show", project, "billing"), ("status", project, "billing")):
        code, view, err = run(*argv)
        assert code == 0, err
        assert not re.search(r"\b1\d{12}\b", view), view
    assert re.search(r"created_at_ms\W+20\d\d-\d\d-\d\dT", run("projects", "show", project)[1])
    # Updated from what `show --json` printed, edited
    code, shown, _ = run("subscriptions", "show", project, "billing", "--json")
    view = json.loads(shown)
    view["max_in_flight"] = 7
    edited = write(tmp_path / "edited.json", view)
    code, updated, err = run("subscriptions", "update", project, "billing", "-f", edited, "--json")
    assert code == 0, err
    assert json.loads(updated)["max_in_flight"] == 7
    assert json.loads(updated)["version"] == view["version"] + 1
    # And from a file of create's fields, without a version (the current one is taken)
    again = write(
        tmp_path / "again.json",
        {"endpoint": {"url": "https://hooks.example.com/b2"}, "max_in_flight": 9},
    )
    code, updated, err = run("subscriptions", "update", project, "billing", "-f", again, "--json")
    assert code == 0, err
    assert json.loads(updated)["endpoint"]["url"] == "https://hooks.example.com/b2"
    # But the edited view, now stale, is refused, saying what to do
    code, _, err = run("subscriptions", "update", project, "billing", "-f", edited)
    assert code == 1 and "409" in err and "show" in err
    # Lifecycle, status and the (empty) unhealthy groups
    assert run("subscriptions", "pause", project, "billing")[1].strip() == "billing: paused"
    code, status, _ = run("status", project, "billing", "--json")
    assert code == 0 and json.loads(status)["state"] == "paused"
    assert "every group is healthy" in run("groups", project, "billing")[1]
    # Deleted in order
    for argv in (
        ("subscriptions", "rm", project, "billing"),
        ("topics", "rm", project, "orders"),
        ("projects", "rm", project),
    ):
        assert run(*argv)[0] == 0, argv


def test_produce_sends_json_lines_in_batches_and_reports(run: Any) -> None:
    project = f"cli{uuid.uuid4().hex[:8]}"
    run("projects", "create", "-f", "-", stdin=json.dumps({"name": project}))
    run("topics", "create", project, "-f", "-", stdin='{"name": "t", "partitions": 1}')
    lines = "\n".join(json.dumps({"message_id": f"m{n}", "body": f"hello {n}"}) for n in range(25))
    try:
        code, out, err = run("produce", project, "t", "--batch", "10", "--json", stdin=lines)
        assert code == 0, err
        assert json.loads(out)["written"] == 25
        # A line that is not JSON stops the command, naming the line
        code, _, err = run("produce", project, "t", stdin='{"message_id": "a"}\nnot json\n')
        assert code == 1 and "line 2 is not JSON" in err
        # And a message the API refuses is named by its line and field (line 13: the third
        # message of the second batch of 10), as the file and the help name them
        bad = [json.dumps({"message_id": f"n{n}", "body": "x"}) for n in range(20)]
        bad[12] = json.dumps({"body": "no id"})
        code, _, err = run("produce", project, "t", "--batch", "10", stdin="\n".join(bad))
        assert code == 1 and "line 13: message_id is required" in err, err
        assert "X_MESSAGE_ID" not in err
    finally:
        run("topics", "rm", project, "t")
        run("projects", "rm", project)


def test_notification_endpoints_are_set_shown_and_removed_with_the_secret_kept_out_of_argv(
    run: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = f"cli{uuid.uuid4().hex[:8]}"
    run("projects", "create", "-f", "-", stdin=json.dumps({"name": project}))
    secret = "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM="
    monkeypatch.setenv("OPS_SECRET", secret)
    try:
        code, out, err = run(
            "notifications",
            "set",
            project,
            "--url",
            "https://hooks.example.com/ops",
            "--event",
            "group.parked",
            "--event",
            "subscription.paused",
            "--signing-secret-env",
            "OPS_SECRET",
            "--json",
        )
        assert code == 0, err
        shown = json.loads(out)
        assert shown["events"] == ["group.parked", "subscription.paused"]
        assert shown["has_signing_secret"] is True and secret not in out
        assert "https://hooks.example.com/ops" in run("notifications", "show", project)[1]
        code, _, err = run(
            "notifications",
            "set",
            project,
            "--url",
            "https://hooks.example.com/ops",
            "--event",
            "group.parked",
            "--signing-secret-env",
            "NOT_SET_ANYWHERE",
        )
        assert code == 1 and "NOT_SET_ANYWHERE is not set" in err
        assert run("notifications", "rm", project)[0] == 0
        # Shown when there is none: how to set one
        code, _, err = run("notifications", "show", project)
        assert code == 1 and f"setu notifications set {project} --url" in err, err
    finally:
        run("projects", "rm", project)


def test_replays_are_started_listed_shown_and_cancelled(run: Any) -> None:
    project = f"cli{uuid.uuid4().hex[:8]}"
    run("projects", "create", "-f", "-", stdin=json.dumps({"name": project}))
    run("topics", "create", project, "-f", "-", stdin=json.dumps({"name": "t", "grouped": True}))
    sub = {"name": "s", "topic": "t", "endpoint": {"url": "https://hooks.example.com/x"}}
    run("subscriptions", "create", project, "-f", "-", stdin=json.dumps(sub))
    try:
        assert "no replays" in run("replays", "ls", project, "s")[1]
        code, out, err = run(
            "replays",
            "start",
            project,
            "s",
            "--from",
            "2026-11-30T00:00:00Z",
            "--group",
            "customer-42",
            "--filter",
            '{"body": "kind", "equals": "refund"}',
            "--rate",
            "5",
            "--json",
        )
        assert code == 0, err
        started = json.loads(out)
        assert started["state"] == "running" and started["group_ids"] == ["customer-42"]
        assert started["rate_per_second"] == 5 and started["filter"]["equals"] == "refund"
        assert started["id"] in run("replays", "ls", project, "s")[1]
        code, out, _ = run("replays", "cancel", project, "s", started["id"], "--json")
        assert code == 0 and json.loads(out)["state"] == "cancelled"
        assert "cancelled" in run("replays", "show", project, "s", started["id"])[1]
        code, _, err = run("replays", "start", project, "s", "--from", "0", "--filter", "{")
        assert code == 1 and "--filter is not JSON" in err
    finally:
        run("subscriptions", "rm", project, "s")
        run("topics", "rm", project, "t")
        run("projects", "rm", project)


def test_errors_say_what_to_do(run: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    code, _, err = run("topics", "ls", "no-such-project")
    assert code == 1 and "404" in err and "setu projects ls" in err
    # A project's key made without its project: the flag to add
    code, _, err = run("keys", "create", "--name", "k", "--role", "producer")
    assert code == 1 and "add --project PROJECT" in err
    monkeypatch.setenv("SETU_API_KEY", "setu_0123456789abcdef_wrong")
    code, _, err = run("projects", "ls")
    assert code == 1 and "401" in err and "SETU_API_KEY" in err
    monkeypatch.setenv("SETU_API_URL", "http://127.0.0.1:1")
    code, _, err = run("projects", "ls")
    assert code == 1 and "no API answers" in err and "SETU_API_URL" in err


def test_every_admin_command_has_help() -> None:
    parser = build_parser()
    for command in (
        "projects",
        "topics",
        "subscriptions",
        "dlq",
        "message",
        "replays",
        "keys",
        "notifications",
    ):
        with pytest.raises(SystemExit) as shown:
            parser.parse_args([command, "--help"])
        assert shown.value.code == 0
