from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from cli.commands import NotInstalled, installed, local_address
from cli.main import build_parser, main


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


class Recorder(BaseHTTPRequestHandler):
    """An HTTP server that answers every GET with an empty list and records who asked."""

    calls: list[tuple[str, str | None]] = []

    def do_GET(self) -> None:
        Recorder.calls.append((self.path, self.headers.get("Authorization")))
        body = json.dumps({"projects": []}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.mark.parametrize(
    "argv",
    [
        ["--api-url", "URL", "--api-key", "KEY", "--json", "projects", "ls"],
        ["projects", "--api-url", "URL", "--api-key", "KEY", "--json", "ls"],
        ["projects", "ls", "--api-url", "URL", "--api-key", "KEY", "--json"],
        ["--api-url", "URL", "projects", "--api-key", "KEY", "ls", "--json"],
    ],
)
def test_the_global_options_work_before_or_after_the_action(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SETU_API_URL", "http://127.0.0.1:1")  # nobody: the option must win
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    Recorder.calls = []
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        given = [url if a == "URL" else "setu_key" if a == "KEY" else a for a in argv]
        assert main(given) == 0
    finally:
        server.shutdown()
        server.server_close()
    assert Recorder.calls == [("/v1/projects", "Bearer setu_key")]
    assert json.loads(capsys.readouterr().out) == {"projects": []}
