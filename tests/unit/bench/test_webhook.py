"""The benches' webhook (bench/latency.py): 200 at once, 503 under /fail/, no answer under
/hang/; it counts only the messages that reached an endpoint answering 200. And bench.fanout's
comparison of the healthy subscriptions before and beside failing ones."""

from __future__ import annotations

import asyncio

from bench.fanout import beside_failing
from bench.latency import _Webhook


async def ask(port: int, path: str, message: str | None = None) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    header = f"x_message_id: {message}\r\n" if message else ""
    method = "POST" if message else "GET"
    writer.write(f"{method} {path} HTTP/1.1\r\n{header}content-length: 0\r\n\r\n".encode())
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(4096), 0.5)
    except TimeoutError:
        return b""
    finally:
        writer.close()


def test_the_webhook_answers_by_path_and_counts_the_healthy_endpoints_only() -> None:
    async def scenario() -> None:
        _Webhook.arrivals.clear()
        _Webhook.answered[0] = 0
        server = await asyncio.get_running_loop().create_server(_Webhook, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            assert (await ask(port, "/hook/1", "m1")).startswith(b"HTTP/1.1 200")
            assert (await ask(port, "/fail/2", "m1")).startswith(b"HTTP/1.1 503")
            assert await ask(port, "/hang/3", "m1") == b""
            count = await ask(port, "/count")
            assert count.endswith(b"\r\n\r\n1")
            assert set(_Webhook.arrivals) == {b"/hook/1#m1", b"/fail/2#m1", b"/hang/3#m1"}
        finally:
            server.close()

    asyncio.run(scenario())


def test_beside_failing_compares_the_same_figures_of_one_run() -> None:
    before = {"produce_to_call_s": {"p50": 0.1, "p95": 0.2, "p99": 0.4}, "calls_made": 100}
    after = {"produce_to_call_s": {"p50": 0.1, "p95": 0.3, "p99": 1.2}, "calls_made": 100}
    compared = beside_failing(before, after)
    assert compared["p99"] == {"before_s": 0.4, "beside_failing_s": 1.2, "ratio": 3.0}
    assert compared["p50"]["ratio"] == 1.0
    assert compared["calls_made"] == [100, 100]
