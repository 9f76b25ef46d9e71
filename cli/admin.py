"""The ``setu`` admin commands: clients of the HTTP API, for operators (README, "Operations").

They reach the API at ``SETU_API_URL`` (or ``--api-url``; default http://127.0.0.1:8080) with
the key in ``SETU_API_KEY`` (or ``--api-key``), print tables (``rich``) or, with ``--json``,
the API's own answers, and show nothing the API does not. An error names what to do next.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import datetime as dt
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import httpx
import yaml
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from setu.model import EVENT_TYPES

DEFAULT_URL = "http://127.0.0.1:8080"
COMMANDS = (
    "projects",
    "topics",
    "subscriptions",
    "status",
    "groups",
    "dlq",
    "replays",
    "message",
    "keys",
    "notifications",
    "produce",
)
KEY_ROLES = ("admin", "owner", "operator", "producer", "viewer")
# How many pages `dlq show` reads looking for one message.
DLQ_SEARCH_PAGES = 50

_HINTS = {
    401: "set SETU_API_KEY (or --api-key) to a valid key; `setu dev up` prints one",
    403: "this key's role may not do that: use a key of a role that may (README, Security)",
    404: "check the names: `setu projects ls`, `setu topics ls PROJECT`, "
    "`setu subscriptions ls PROJECT`",
    409: "read the current state again (`show`) and retry, or do what the message says first",
    413: "send less at once (a smaller body or batch)",
    429: "the project is over its produce quota: slow down, or ask an admin to raise it",
    503: "a dependency of the API does not answer: check GET /v1/health",
}


class Failed(Exception):
    """A command that could not be done; its message says why and what to do."""


class Api:
    def __init__(self, url: str, key: str | None, timeout_s: float = 30.0) -> None:
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s)

    def close(self) -> None:
        self._http.close()

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self.send(method, path, **kwargs)
        if response.status_code >= 400:
            raise Failed(explain(response))
        return response.json() if response.content else None

    def send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._http.request(method, path, **kwargs)
        except httpx.ConnectError:
            raise Failed(
                f"no API answers at {self.url}: start it (`setu dev up`), or point "
                "SETU_API_URL (or --api-url) at it"
            ) from None
        except httpx.TimeoutException:
            raise Failed(f"the API at {self.url} did not answer in time; try again") from None


def explain(response: httpx.Response) -> str:
    """The API's error, with what to do about it."""
    try:
        error = response.json()["error"]
        what = f"{error['code']}: {error['message']}"
    except (ValueError, KeyError, TypeError):
        what = response.text[:200] or response.reason_phrase
    hint = _HINTS.get(response.status_code)
    if response.status_code == 429 and "retry-after" in response.headers:
        hint = f"over the project's produce quota: retry in {response.headers['retry-after']} s"
    return f"{response.status_code} {what}" + (f"\n  -> {hint}" if hint else "")


# Output


class Out:
    def __init__(self, as_json: bool, stream: TextIO | None = None) -> None:
        self.as_json = as_json
        self.console = Console(file=stream or sys.stdout, width=160, soft_wrap=True)

    def json(self, data: Any) -> None:
        self.console.print_json(json.dumps(data))

    def table(
        self,
        data: Any,
        rows: Iterable[dict[str, Any]],
        columns: Sequence[tuple[str, Callable[[dict[str, Any]], Any]]],
        title: str | None = None,
    ) -> None:
        if self.as_json:
            self.json(data)
            return
        table = Table(title=title)
        for header, _ in columns:
            table.add_column(header)
        for row in rows:
            table.add_row(*(_cell(get(row)) for _, get in columns))
        self.console.print(table)

    def record(self, data: dict[str, Any], title: str | None = None) -> None:
        """One object as a two-column table (nested values as compact JSON)."""
        if self.as_json:
            self.json(data)
            return
        table = Table(title=title, show_header=False)
        table.add_column(style="bold")
        table.add_column()
        for key, value in data.items():
            table.add_row(key, _cell(readable(key, value)))
        self.console.print(table)

    def say(self, line: str) -> None:
        if not self.as_json:
            self.console.print(line, markup=False, highlight=False)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


# Fields of the API's views that hold a moment in epoch milliseconds besides every *_at_ms.
MOMENTS = frozenset(("since_ms", "oldest_undelivered_ms", "timestamp_ms"))


def readable(key: str, value: Any) -> Any:
    """``value`` of the view field ``key`` as a person reads it: moments (``*_at_ms``, ...)
    as ISO 8601 times, ages (``*_age_ms``) in seconds; nested objects likewise."""
    if isinstance(value, dict):
        return {k: readable(k, v) for k, v in value.items()}
    if isinstance(value, list):
        return [readable(key, v) for v in value]
    if isinstance(value, int) and not isinstance(value, bool):
        if key.endswith("_at_ms") or key in MOMENTS:
            return at(value)
        if key.endswith("_age_ms"):
            return f"{value / 1000:.1f} s"
    return value


def at(ms: int | None) -> str:
    """A time in ms as ISO 8601 (UTC)."""
    if ms is None:
        return "-"
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds")


def parse_time(text: str) -> int:
    """Epoch milliseconds, or an ISO 8601 time (UTC unless it says otherwise)."""
    if text.isdigit():
        return int(text)
    try:
        parsed = dt.datetime.fromisoformat(text)
    except ValueError:
        raise Failed(f"{text!r} is neither epoch milliseconds nor an ISO 8601 time") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return int(parsed.timestamp() * 1000)


def load_file(path: str) -> Any:
    """A YAML or JSON document from ``path`` (``-``: standard input)."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as exc:
        raise Failed(f"cannot read {path}: {exc.strerror}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise Failed(f"{path} is not YAML or JSON: {exc}") from None


# The parser


PRODUCE_FORMAT = """\
each line one JSON object, a message of the batch produce API:
  message_id     required, 1..100 characters
  group_id       required on a grouped topic
  producer_id    with sequence_id (an integer): dropped if the producer sent it before
  headers        an object of X_* headers, forwarded to the webhook
  body           text, or body_base64 for bytes
for example:
  {"message_id": "m-1", "group_id": "order-7", "body": "{\\"total\\": 12}"}
  {"message_id": "m-2", "group_id": "order-7", "headers": {"X_REGION": "eu"}, "body_base64": "AAEC"}
"""


def add_global_options(parser: argparse.ArgumentParser) -> None:
    """``--api-url``, ``--api-key`` and ``--json``. They are accepted at every level of a
    command (``setu --json projects ls``, ``setu projects --json ls``, ``setu projects ls
    --json``): a level that does not see one leaves what an outer level read (no default)."""
    parser.add_argument(
        "--api-url",
        default=argparse.SUPPRESS,
        help="the API (default: SETU_API_URL, else " + DEFAULT_URL + ")",
    )
    parser.add_argument(
        "--api-key", default=argparse.SUPPRESS, help="an API key (default: SETU_API_KEY)"
    )
    parser.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS,
        help="print the API's answers as JSON",
    )


def add_commands(sub: Any) -> None:
    """Adds the admin commands to the ``setu`` parser's sub-commands."""
    common = argparse.ArgumentParser(add_help=False)
    add_global_options(common)

    def group(name: str, text: str) -> Any:
        parser = sub.add_parser(name, help=text, parents=[common])
        return parser.add_subparsers(dest="action", required=True, metavar="ACTION")

    def action(parent: Any, name: str, text: str, *args: str) -> Any:
        parser = parent.add_parser(name, help=text, parents=[common])
        for arg in args:
            parser.add_argument(arg)
        return parser

    projects = group("projects", "list, show, create and delete projects")
    action(projects, "ls", "the projects this key sees")
    action(projects, "show", "one project", "project")
    action(projects, "create", "from a YAML/JSON file (-f)").add_argument(
        "-f", "--file", required=True
    )
    action(projects, "rm", "delete an empty project", "project")
    quota = action(projects, "quota", "set a project's produce quota (admin)", "project")
    quota.add_argument("--messages-per-second", type=float)
    quota.add_argument("--bytes-per-second", type=float)

    topics = group("topics", "list, show, create and delete topics")
    action(topics, "ls", "a project's topics", "project")
    action(topics, "show", "one topic", "project", "topic")
    made = action(topics, "create", "from a YAML/JSON file (-f)", "project")
    made.add_argument("-f", "--file", required=True)
    action(topics, "rm", "delete a topic and its Kafka topics", "project", "topic")

    subs = group("subscriptions", "list, show, create, delete, start/stop/pause/resume, seek")
    action(subs, "ls", "a project's subscriptions", "project")
    action(subs, "show", "one subscription", "project", "subscription")
    made = action(subs, "create", "from a YAML/JSON file (-f)", "project")
    made.add_argument("-f", "--file", required=True)
    changed = action(
        subs,
        "update",
        "replace a subscription's configuration from a YAML/JSON file (-f): the fields of "
        "create, or what `show --json` printed, edited; its version guards against a change "
        "made meanwhile (left out: the current one)",
        "project",
        "subscription",
    )
    changed.add_argument("-f", "--file", required=True)
    action(subs, "rm", "delete a subscription", "project", "subscription")
    for verb in ("start", "pause", "resume"):
        action(subs, verb, f"{verb} a subscription", "project", "subscription")
    stop = action(subs, "stop", "stop a subscription", "project", "subscription")
    stop.add_argument(
        "--forced",
        action="store_true",
        help="abandon calls in progress (made again on start) instead of letting them finish",
    )
    seek = action(
        subs, "seek", "where a stopped subscription starts again", "project", "subscription"
    )
    seek.add_argument("--to", required=True, help="epoch ms or ISO 8601 time")

    status = sub.add_parser(
        "status", help="a subscription's state, lag and failures", parents=[common]
    )
    status.add_argument("project")
    status.add_argument("subscription")

    groups = sub.add_parser("groups", help="a subscription's unhealthy groups", parents=[common])
    groups.add_argument("project")
    groups.add_argument("subscription")
    groups.add_argument("--state", choices=["retrying", "dead_lettered", "scheduled"])
    groups.add_argument("--limit", type=int, default=50)
    groups.add_argument("--after", help="the cursor a previous page ended with")

    dlq = group("dlq", "browse and unsideline dead letters")
    listed = action(dlq, "ls", "dead letters, oldest first", "project", "subscription")
    listed.add_argument("--group")
    listed.add_argument("--limit", type=int, default=50)
    listed.add_argument("--after")
    action(dlq, "show", "one dead letter, body shown", "project", "subscription", "message_id")
    again = action(
        dlq, "unsideline", "deliver dead letters again, in order", "project", "subscription"
    )
    which = again.add_mutually_exclusive_group(required=True)
    which.add_argument("--group", action="append", dest="groups", metavar="GROUP_ID")
    which.add_argument("--message", action="append", dest="messages", metavar="MESSAGE_ID")
    which.add_argument("--failed-before", help="epoch ms or ISO 8601 time")

    replays = group("replays", "deliver a window again (docs/replays.md)")
    action(replays, "ls", "a subscription's replays, newest first", "project", "subscription")
    action(replays, "show", "one replay and its progress", "project", "subscription", "replay_id")
    started = action(
        replays,
        "start",
        "deliver again what a window holds (some groups, some messages, a filter)",
        "project",
        "subscription",
    )
    started.add_argument("--from", dest="from_", required=True, help="epoch ms or ISO 8601 time")
    started.add_argument("--to", help="epoch ms or ISO 8601 time (default: now)")
    started.add_argument("--group", action="append", dest="groups", metavar="GROUP_ID")
    started.add_argument("--message", action="append", dest="messages", metavar="MESSAGE_ID")
    started.add_argument("--filter", help="a filter as JSON (docs/policies.md §1)")
    started.add_argument("--rate", type=float, help="calls per second (default: the API's)")
    action(replays, "cancel", "stop a running replay", "project", "subscription", "replay_id")

    message = group("message", "a message's delivery record")
    action(message, "show", "each attempt and move", "project", "subscription", "message_id")

    keys = group("keys", "API keys")
    listed = action(keys, "ls", "keys (of a project with --project; all: admin)")
    listed.add_argument("--project")
    made = action(keys, "create", "a key, shown once")
    made.add_argument("--name", required=True)
    made.add_argument("--role", required=True, choices=KEY_ROLES)
    made.add_argument("--project", help="the key's project (every role but admin has one)")
    made.add_argument("--topic", action="append", dest="topics")
    made.add_argument("--expires", help="epoch ms or ISO 8601 time")
    gone = action(keys, "revoke", "revoke a key", "key_id")
    gone.add_argument("--project")

    notes = group("notifications", "where a project's operational events go")
    action(notes, "show", "the project's notification endpoint", "project")
    told = action(notes, "set", "send the project's events to --url", "project")
    told.add_argument("--url", required=True)
    told.add_argument(
        "--event",
        action="append",
        dest="events",
        required=True,
        choices=list(EVENT_TYPES),
        help="an event type to send (repeat for more)",
    )
    told.add_argument(
        "--signing-secret-env",
        metavar="VARIABLE",
        help="sign with the secret in this environment variable (not on the command line, "
        "where other users see it); left out: the stored secret is kept",
    )
    action(notes, "rm", "stop sending the project's events", "project")

    produce = sub.add_parser(
        "produce",
        help="produce JSON lines (batch-produce messages) from a file or stdin",
        parents=[common],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=PRODUCE_FORMAT,
    )
    produce.add_argument("project")
    produce.add_argument("topic")
    produce.add_argument("-f", "--file", default="-", help="JSON lines; - for stdin (default)")
    produce.add_argument("--batch", type=int, default=500, help="messages per request")


def run(args: argparse.Namespace, out_stream: TextIO | None = None) -> int:
    """Runs one admin command; prints errors to stderr with what to do, and exits 1 then."""
    url = getattr(args, "api_url", None) or os.environ.get("SETU_API_URL") or DEFAULT_URL
    key = getattr(args, "api_key", None) or os.environ.get("SETU_API_KEY")
    api = Api(url, key)
    out = Out(getattr(args, "json", False), out_stream)
    try:
        _dispatch(args, api, out)
        return 0
    except Failed as failed:
        print(f"setu {args.command}: {failed}", file=sys.stderr)
        return 1
    finally:
        api.close()


def _dispatch(args: argparse.Namespace, api: Api, out: Out) -> None:
    handlers: dict[str, Callable[[argparse.Namespace, Api, Out], None]] = {
        "projects": _projects,
        "topics": _topics,
        "subscriptions": _subscriptions,
        "status": _status,
        "groups": _groups,
        "dlq": _dlq,
        "message": _message,
        "replays": _replays,
        "keys": _keys,
        "notifications": _notifications,
        "produce": _produce,
    }
    handlers[args.command](args, api, out)


# Resources


Column = tuple[str, Callable[[dict[str, Any]], Any]]


def _crud(
    a: argparse.Namespace,
    api: Api,
    out: Out,
    base: str,
    item: str | None,
    listing: str,
    columns: Sequence[Column],
) -> bool:
    """``ls``, ``show``, ``create -f`` and ``rm`` of one kind of resource at ``base``;
    False for any other action."""
    if a.action == "ls":
        data = api.call("GET", base)
        out.table(data, data[listing], columns)
    elif a.action == "show":
        out.record(api.call("GET", f"{base}/{item}"))
    elif a.action == "create":
        out.record(api.call("POST", base, json=load_file(a.file)))
    elif a.action == "rm":
        api.call("DELETE", f"{base}/{item}")
        out.say(f"deleted {listing[:-1]} {item}")
    else:
        return False
    return True


def _projects(a: argparse.Namespace, api: Api, out: Out) -> None:
    columns: list[Column] = [
        ("name", lambda p: p["name"]),
        ("description", lambda p: p["description"]),
        ("quota", lambda p: p["quota"]),
        ("created", lambda p: at(p["created_at_ms"])),
    ]
    if _crud(a, api, out, "/v1/projects", getattr(a, "project", None), "projects", columns):
        return
    body = {"messages_per_second": a.messages_per_second, "bytes_per_second": a.bytes_per_second}
    out.record(api.call("PUT", f"/v1/projects/{a.project}/quota", json=body))


def _notifications(a: argparse.Namespace, api: Api, out: Out) -> None:
    path = f"/v1/projects/{a.project}/notifications"
    if a.action == "show":
        response = api.send("GET", path)
        if response.status_code == 404 and "no notification endpoint" in response.text:
            api.call("GET", f"/v1/projects/{a.project}")  # a project that is not: its error
            raise Failed(
                f"{a.project} sends its events nowhere yet\n  -> set where: setu notifications "
                f"set {a.project} --url URL --event TYPE (--event again for more)"
            )
        if response.status_code >= 400:
            raise Failed(explain(response))
        out.record(response.json())
    elif a.action == "rm":
        api.call("DELETE", path)
        out.say(f"{a.project}: no notification endpoint")
    else:
        body: dict[str, Any] = {"url": a.url, "events": a.events}
        if a.signing_secret_env:
            secret = os.environ.get(a.signing_secret_env)
            if not secret:
                raise Failed(f"{a.signing_secret_env} is not set")
            body["signing_secret"] = secret
        out.record(api.call("PUT", path, json=body))


def _topics(a: argparse.Namespace, api: Api, out: Out) -> None:
    columns: list[Column] = [
        ("name", lambda t: t["name"]),
        ("grouped", lambda t: t["grouped"]),
        ("partitions", lambda t: t["partitions"]),
        ("retention h", lambda t: t["retention_hours"]),
    ]
    base = f"/v1/projects/{a.project}/topics"
    _crud(a, api, out, base, getattr(a, "topic", None), "topics", columns)


def _subscriptions(a: argparse.Namespace, api: Api, out: Out) -> None:
    columns: list[Column] = [
        ("name", lambda s: s["name"]),
        ("topic", lambda s: s["topic"]),
        ("state", lambda s: s["state"]),
        ("grouped", lambda s: s["grouped"]),
        ("endpoint", lambda s: s["endpoint"]["url"]),
        ("version", lambda s: s["version"]),
    ]
    base = f"/v1/projects/{a.project}/subscriptions"
    if _crud(a, api, out, base, getattr(a, "subscription", None), "subscriptions", columns):
        return
    if a.action == "update":
        path = f"{base}/{a.subscription}"
        given = load_file(a.file)
        if not isinstance(given, dict):
            raise Failed(f"{a.file} holds no subscription (a mapping of its fields)")
        current = api.call("GET", path) if "version" not in given else None
        out.record(api.call("PUT", path, json=update_body(given, current)))
        return
    if a.action == "seek":
        body = {"timestamp_ms": parse_time(a.to)}
        out.record(api.call("POST", f"{base}/{a.subscription}/seek", json=body))
        return
    if a.action == "stop":
        mode = "forced" if a.forced else "graceful"
        done = api.call("POST", f"{base}/{a.subscription}/stop", json={"mode": mode})
        if out.as_json:
            out.record(done)
            return
        out.say(f"{a.subscription}: stopped ({done['mode']})")
        for worker in done["workers"]:
            abandoned = worker["abandoned_calls"]
            out.say(
                f"  {worker['worker']} confirmed at {at(worker['stopped_at_ms'])}"
                + (f", {abandoned} call(s) abandoned" if abandoned else "")
                + ("" if worker["drained"] else ", drain cut short")
            )
        for worker in done["pending_workers"]:
            out.say(f"  {worker} has not confirmed yet (see status)")
        return
    state = api.call("POST", f"{base}/{a.subscription}/{a.action}")
    out.record(state) if out.as_json else out.say(f"{a.subscription}: {state['state']}")


# What a subscription's view shows and its configuration does not take (`show --json`).
VIEW_ONLY = frozenset(
    {"project", "has_signing_secret", "signing_secrets", "state", "paused_reason"}
    | {"created_at_ms", "kafka"}
)


def update_body(given: Mapping[str, Any], current: Mapping[str, Any] | None) -> dict[str, Any]:
    """The PUT body of ``subscriptions update``: ``given`` without what only a view shows (its
    endpoint's header names: headers left out keep the stored ones), with the current version
    when ``given`` has none."""
    body = {k: v for k, v in given.items() if k not in VIEW_ONLY}
    endpoint = body.get("endpoint")
    if isinstance(endpoint, dict):
        body["endpoint"] = {k: v for k, v in endpoint.items() if k != "header_names"}
    if "version" not in body and current is not None:
        body["version"] = current["version"]
    return body


def _sub_path(a: argparse.Namespace) -> str:
    return f"/v1/projects/{a.project}/subscriptions/{a.subscription}"


def _status(a: argparse.Namespace, api: Api, out: Out) -> None:
    data = api.call("GET", f"{_sub_path(a)}/status")
    if out.as_json:
        out.json(data)
        return
    shown = {k: v for k, v in data.items() if k not in ("partitions", "ingest")}
    shown["ingest"] = {k: data["ingest"].get(k) for k in ("state", "ok", "lag")}
    out.record(shown, title=f"{a.project}/{a.subscription}")
    out.table(
        data,
        data["partitions"],
        [
            ("partition", lambda p: p["partition"]),
            ("lag", lambda p: p["lag"]),
            ("oldest undelivered", lambda p: at(p["oldest_undelivered_ms"])),
        ],
    )


def _page(api: Api, path: str, **params: Any) -> Any:
    """One page of a listing; parameters left as None are not sent."""
    return api.call("GET", path, params={k: v for k, v in params.items() if v is not None})


def _more(out: Out, data: dict[str, Any]) -> bool:
    """Says how to get the next page, if there is one."""
    if data["next"]:
        out.say(f"more: --after {data['next']}")
    return bool(data["next"])


def _groups(a: argparse.Namespace, api: Api, out: Out) -> None:
    data = _page(api, f"{_sub_path(a)}/groups", limit=a.limit, state=a.state, after=a.after)
    out.table(
        data,
        data["groups"],
        [
            ("group", lambda g: g["group_id"]),
            ("state", lambda g: g["state"]),
            ("tier", lambda g: g["tier"]),
            ("parked", lambda g: g["parked"]),
            ("head message", lambda g: g["head_message_id"]),
            ("due", lambda g: at(g["due_at_ms"]) if g.get("due_at_ms") else "-"),
            ("unhealthy since", lambda g: at(g["since_ms"])),
        ],
        title="unhealthy groups, the longest unhealthy first",
    )
    if not _more(out, data) and not data["groups"]:
        out.say("every group is healthy")


def _dlq(a: argparse.Namespace, api: Api, out: Out) -> None:
    base = f"{_sub_path(a)}/dlq"
    if a.action == "ls":
        data = _page(api, f"{base}/messages", limit=a.limit, group_id=a.group, after=a.after)
        out.table(
            data,
            data["messages"],
            [
                ("message", lambda m: m["message_id"]),
                ("group", lambda m: m["group_id"]),
                ("failed at", lambda m: at(m["failed_at"])),
                ("attempts", lambda m: m["attempts"]),
                ("error", lambda m: m["error"]),
                ("parked", lambda m: m["parked"]),
            ],
        )
        _more(out, data)
    elif a.action == "show":
        found = _find_dead_letter(api, base, a.message_id)
        if out.as_json:
            out.json(found)
            return
        payload = found.pop("body")
        encoding = found.pop("body_encoding", None)
        out.record(found, title=f"dead letter {a.message_id}")
        out.console.print(show_body(payload, encoding), markup=False, highlight=False)
    elif a.action == "unsideline":
        if a.groups:
            body: dict[str, Any] = {"group_ids": a.groups}
        elif a.messages:
            body = {"message_ids": a.messages}
        else:
            body = {"failed_before": parse_time(a.failed_before)}
        data = api.call("POST", f"{base}/unsideline", json=body)
        out.record(data) if out.as_json else out.say(f"requeued {data['requeued']}")


REPLAY_COLUMNS: list[Column] = [
    ("replay", lambda r: r["id"]),
    ("state", lambda r: r["state"]),
    ("window", lambda r: f"{at(r['from_ms'])} to {at(r['to_ms'])}"),
    ("matched", lambda r: r["progress"]["matched"]),
    ("delivered", lambda r: r["progress"]["delivered"]),
    ("failed", lambda r: r["progress"]["failed"]),
    ("waiting groups", lambda r: r["progress"]["waiting_groups"]),
    (
        "partitions done",
        lambda r: f"{r['progress']['partitions_done']}/{r['progress']['partitions']}",
    ),
]


def _replays(a: argparse.Namespace, api: Api, out: Out) -> None:
    base = f"{_sub_path(a)}/replays"
    if a.action == "ls":
        data = api.call("GET", base)
        out.table(data, data["replays"], REPLAY_COLUMNS)
        if not data["replays"] and not out.as_json:
            out.say("no replays")
        return
    if a.action == "start":
        body: dict[str, Any] = {"from_ms": parse_time(a.from_)}
        if a.to:
            body["to_ms"] = parse_time(a.to)
        if a.groups:
            body["group_ids"] = a.groups
        if a.messages:
            body["message_ids"] = a.messages
        if a.filter:
            try:
                body["filter"] = json.loads(a.filter)
            except ValueError as exc:
                raise Failed(f"--filter is not JSON: {exc}") from None
        if a.rate is not None:
            body["rate_per_second"] = a.rate
        data = api.call("POST", base, json=body)
    elif a.action == "cancel":
        data = api.call("POST", f"{base}/{a.replay_id}/cancel")
    else:
        data = api.call("GET", f"{base}/{a.replay_id}")
    out.table(data, [data], REPLAY_COLUMNS)


def _find_dead_letter(api: Api, base: str, message_id: str) -> dict[str, Any]:
    after = None
    for _ in range(DLQ_SEARCH_PAGES):
        params = {"limit": 1000, **({"after": after} if after else {})}
        data = api.call("GET", f"{base}/messages", params=params)
        for letter in data["messages"]:
            if letter["message_id"] == message_id:
                return dict(letter)
        after = data["next"]
        if not after:
            break
    raise Failed(
        f"no dead letter {message_id!r} found (`setu message show` tells where a message is)"
    )


def show_body(body: str, encoding: str | None) -> str:
    """A dead letter's body as pretty JSON, as text, or as base64 when it is neither."""
    raw: bytes
    if encoding == "base64":
        try:
            raw = base64.b64decode(body)
        except (binascii.Error, ValueError):
            return body
    else:
        raw = body.encode()
    try:
        return json.dumps(json.loads(raw), indent=2, ensure_ascii=False)
    except ValueError:
        pass
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return f"(base64) {base64.b64encode(raw).decode()}"


def _message(a: argparse.Namespace, api: Api, out: Out) -> None:
    data = api.call("GET", f"{_sub_path(a)}/messages/{a.message_id}")
    if out.as_json:
        out.json(data)
        return
    out.say(f"{data['message_id']}: {data['location']}")
    steps = [
        {
            "at": x["at_ms"],
            "what": f"attempt {x['attempt']} from {x['tier']}: {x['outcome']}",
            "detail": x["status"] or x["error"],
            "ms": x["duration_ms"],
            "answer": x["response_excerpt"],
        }
        for x in data["attempts"]
    ] + [
        {
            "at": m["at_ms"],
            "what": f"moved to {m['to']} ({m['why']})",
            "detail": None,
            "ms": None,
            "answer": None,
        }
        for m in data["moves"]
    ]
    out.table(
        data,
        sorted(steps, key=lambda s: s["at"]),
        [
            ("when", lambda s: at(s["at"])),
            ("what", lambda s: s["what"]),
            ("status / error", lambda s: s["detail"]),
            ("ms", lambda s: s["ms"]),
            ("answer", lambda s: (s["answer"] or "")[:120] or None),
        ],
    )


def _keys(a: argparse.Namespace, api: Api, out: Out) -> None:
    base = f"/v1/projects/{a.project}/keys" if a.project else "/v1/keys"
    if a.action == "ls":
        data = api.call("GET", base)
        out.table(
            data,
            data["keys"],
            [
                ("id", lambda k: k["id"]),
                ("name", lambda k: k["name"]),
                ("role", lambda k: k["role"]),
                ("project", lambda k: k["project"]),
                ("topics", lambda k: k["topics"]),
                ("expires", lambda k: at(k["expires_at_ms"])),
                ("last used", lambda k: at(k["last_used_at_ms"])),
            ],
        )
    elif a.action == "create":
        if a.role != "admin" and not a.project:
            raise Failed(f"a key of role {a.role} belongs to a project: add --project PROJECT")
        body: dict[str, Any] = {"name": a.name, "role": a.role}
        if a.topics:
            body["topics"] = a.topics
        if a.expires:
            body["expires_at_ms"] = parse_time(a.expires)
        if a.project and base == "/v1/keys":
            body["project"] = a.project
        made = api.call("POST", base, json=body)
        if out.as_json:
            out.json(made)
            return
        out.say(f"key {made['id']} ({made['role']}), shown this once:")
        out.say(made["key"])
    elif a.action == "revoke":
        api.call("DELETE", f"{base}/{a.key_id}")
        out.say(f"revoked {a.key_id}")


# Produce


def read_lines(stream: TextIO) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, message) of each non-blank JSON line."""
    for number, line in enumerate(stream, 1):
        if not line.strip():
            continue
        try:
            message = json.loads(line)
        except ValueError as exc:
            raise Failed(f"line {number} is not JSON: {exc}") from None
        if not isinstance(message, dict):
            raise Failed(f"line {number} is not a JSON object (a batch-produce message)")
        yield number, message


def _produce(a: argparse.Namespace, api: Api, out: Out) -> None:
    if a.batch < 1:
        raise Failed("--batch must be at least 1")
    path = f"/v1/projects/{a.project}/topics/{a.topic}/produce/batch"
    stream = sys.stdin if a.file == "-" else _open(a.file)
    sent = written = 0
    started = time.monotonic()
    with Progress(
        TextColumn("producing"),
        BarColumn(),
        TextColumn("{task.completed} messages"),
        TimeElapsedColumn(),
        console=out.console,
        disable=out.as_json,
        transient=True,
    ) as progress:
        task = progress.add_task("produce", total=None)
        batch: list[tuple[int, dict[str, Any]]] = []
        for numbered in read_lines(stream):
            batch.append(numbered)
            if len(batch) == a.batch:
                written += send_batch(api, path, batch)
                sent += len(batch)
                progress.update(task, completed=sent)
                batch = []
        if batch:
            written += send_batch(api, path, batch)
            sent += len(batch)
            progress.update(task, completed=sent)
    seconds = time.monotonic() - started
    summary = {
        "sent": sent,
        "written": written,
        "seconds": round(seconds, 2),
        "messages_per_second": round(sent / seconds) if seconds > 0 else None,
    }
    if out.as_json:
        out.json(summary)
    else:
        out.say(f"produced {written} of {sent} messages in {seconds:.1f} s")


def _open(path: str) -> TextIO:
    try:
        return open(path)
    except OSError as exc:
        raise Failed(f"cannot read {path}: {exc.strerror}") from None


def send_batch(api: Api, path: str, batch: list[tuple[int, dict[str, Any]]], tries: int = 5) -> int:
    """Sends a batch of (line number, message); messages the API could not write (207) and
    429/503 answers are sent again, with the same ids, after a pause. Returns how many were
    written. A refusal names the line of the message the API found wrong."""
    pending = batch
    for attempt in range(tries):
        response = api.send("POST", path, json={"messages": [m for _, m in pending]})
        if response.status_code in (200, 207):
            results = response.json()["results"]
            failed = [m for m, r in zip(pending, results, strict=True) if r["status"] != "ok"]
            if not failed:
                return len(batch)
            pending = failed
        elif response.status_code not in (429, 503):
            raise Failed(_named_by_lines(explain(response), [n for n, _ in pending]))
        time.sleep(float(response.headers.get("retry-after", 0.5 * 2**attempt)))
    raise Failed(
        f"{len(pending)} message(s) not written after {tries} tries "
        f"(the first: {pending[0][1].get('message_id')!r}, line {pending[0][0]}); send them "
        "again later"
    )


# How the batch API names a message it refused.
_BATCH_INDEX = re.compile(r"messages\[(\d+)\]")


def _named_by_lines(text: str, lines: Sequence[int]) -> str:
    """``text`` with each ``messages[i]`` of a batch named by its line in the file."""

    def line_of(match: re.Match[str]) -> str:
        index = int(match.group(1))
        return f"line {lines[index]}" if index < len(lines) else match.group(0)

    return _BATCH_INDEX.sub(line_of, text)
