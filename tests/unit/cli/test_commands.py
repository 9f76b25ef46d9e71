from __future__ import annotations

import pytest

from cli.commands import NotInstalled, installed, local_address
from cli.main import build_parser


def test_a_missing_module_is_reported_as_not_installed() -> None:
    with pytest.raises(NotInstalled, match=r"cli\.no_such_module"), installed("cli.no_such_module"):
        import cli.no_such_module  # type: ignore[import-not-found]  # noqa: F401


def test_a_module_missing_inside_an_installed_one_is_a_real_error() -> None:
    with pytest.raises(ModuleNotFoundError), installed("cli.commands"):
        import cli.no_such_dependency  # type: ignore[import-not-found]  # noqa: F401


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
