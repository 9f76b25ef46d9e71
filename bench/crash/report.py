"""The crash-test report: a JSON file, and a few lines for a human."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from bench.crash.checker import MUST_BE_ZERO


def write_report(report: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))


def summary_lines(report: dict[str, Any]) -> list[str]:
    """The figures the crash test promises, each marked with its verdict."""

    def zero(name: str, label: str) -> str:
        mark = "ok  " if report[name] == 0 else "FAIL"
        return f"  {mark} {label:<48} {report[name]}"

    labels = {
        "lost": "accepted messages lost",
        "out_of_order_groups": "groups out of published order (first 2xx)",
        "early_calls": "calls before an earlier message was delivered",
        "corrupt_calls": "corrupt payloads (calls)",
        "unknown_calls": "calls for never-published messages",
        "webhook_id_mismatches": "calls whose webhook-id is not the message id",
        "bad_signatures": "calls with a bad webhook-signature",
        "id_distinct_duplicates": "duplicates after dropping repeated webhook-ids",
        "short_budget_dead_letters": "dead-lettered before N+1 attempts (retryable)",
        "calls_before_their_time": "scheduled messages called before their time",
    }
    lines = [f"crash test: {'PASS' if report['ok'] else 'FAIL'}"]
    if report.get("subscriptions", 1) > 1:
        failing = report.get("failing_subscriptions") or {}
        lines.append(
            f"       {'subscriptions of the topic (judged each alone)':<48} "
            f"{report['subscriptions']}, failing: {failing or 'none'}"
        )
    lines += [zero(name, labels[name]) for name in MUST_BE_ZERO]
    lines += [
        f"       {'raw duplicate calls (allowed, reported)':<48} {report['raw_duplicates']}",
        f"       {'kill/restart events':<48} {report.get('kill_restart_events', 0)}",
        f"       {'fault events':<48} {report.get('fault_events', 0)} "
        f"{report.get('faults_by_kind', {})}",
        f"       {'accepted / delivered / published':<48} "
        f"{report['accepted']} / {report['delivered']} / {report['published']}",
        f"       {'webhook calls':<48} {report['calls']} {report['calls_by_status']}",
        f"       {'flaky groups / their messages dead-lettered':<48} "
        f"{report.get('flaky_groups', 0)} / {report.get('flaky_messages_dead_lettered', 0)}",
        f"       {'scheduled messages delivered, none early':<48} "
        f"{report.get('scheduled_delivered', 0)}",
    ]
    if report.get("acked_via"):
        lines.append(
            f"       {'acknowledged via (http, stream, server)':<48} {report['acked_via']}"
        )
    if report.get("stream_drops"):
        lines.append(
            f"       {'streaming connections dropped (close, reset)':<48} {report['stream_drops']}"
        )
    chaos = report.get("chaos")
    if chaos:
        lines.append(f"       {'kills by component':<48} {chaos['kills_by_component']}")
        if chaos.get("extended_s"):
            lines.append(f"       {'chaos past its duration (s)':<48} {chaos['extended_s']}")
        exits = {k: v for k, v in chaos["exits_by_component"].items() if v}
        if exits:
            lines.append(f"       {'exits on their own':<48} {exits}")
    outage = report.get("outage")
    if outage and not outage["started"]:
        lines.append("  FAIL endpoint outage: no call came after its planned start")
    elif outage:
        mark = "ok  " if not outage["violations"] else "FAIL"
        lines += [
            f"  {mark} {'endpoint outage: breaker opened / closed after':<48} "
            f"{outage['breaker_opened']} / {outage['breaker_closed']}",
            f"       {'outage: seconds / calls / attempts spent':<48} "
            f"{outage['seconds']} / {outage['calls']} / {outage['attempts_spent']}",
            f"       {'outage: opened after / closed after its end (ms)':<48} "
            f"{outage['first_opened_after_ms']} / {outage['closed_after_outage_ms']}",
        ]
    for exit_ in report.get("exits_on_their_own", [])[:3]:
        name, code = exit_["component"], exit_["code"]
        lines.append(f"  {name} exited on its own (code {code}); the end of its log:")
        lines += [f"    | {line}" for line in exit_["log"].splitlines()[-8:]]
    if report["violations"]:
        lines.append(f"  violations: {', '.join(report['violations'])}")
    return lines
