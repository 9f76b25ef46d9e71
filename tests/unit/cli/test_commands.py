from __future__ import annotations

import pytest

from cli.commands import NotInstalled, load, local_address
from cli.main import build_parser


def test_a_present_function_is_loaded() -> None:
    assert load("cli.commands", "load") is load


def test_a_missing_module_is_reported_as_not_installed() -> None:
    with pytest.raises(NotInstalled, match=r"cli\.no_such_module"):
        load("cli.no_such_module", "run")


def test_a_missing_function_is_reported_as_not_installed() -> None:
    with pytest.raises(NotInstalled, match=r"cli\.commands\.no_such_function"):
        load("cli.commands", "no_such_function")


@pytest.mark.parametrize(
    ("host", "address"),
    [("0.0.0.0", "127.0.0.1"), ("127.0.0.1", "127.0.0.1"), ("::", "[::1]"), ("::1", "[::1]")],
)
def test_a_wildcard_listener_is_checked_through_loopback(host: str, address: str) -> None:
    assert local_address(host) == address


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["api"], "api"),
        (["deliver", "--check"], "deliver"),
        (["ingest"], "ingest"),
        (["migrate"], "migrate"),
        (["dev", "up"], "dev"),
        (["services", "run", "--", "pytest", "-x"], "services"),
    ],
)
def test_every_process_has_a_sub_command(argv: list[str], command: str) -> None:
    assert build_parser().parse_args(argv).command == command


def test_services_run_passes_the_command_through_untouched() -> None:
    args = build_parser().parse_args(["services", "run", "--", "pytest", "-k", "x", "--lf"])
    assert args.argv[-4:] == ["pytest", "-k", "x", "--lf"]
