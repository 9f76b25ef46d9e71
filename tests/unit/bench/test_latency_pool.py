"""bench.latency's connection pool: the load never holds more connections than its cap, and a
message past the cap waits for one instead of opening another."""

from __future__ import annotations

import asyncio

from bench.latency import Pool


async def test_past_its_cap_a_take_waits_for_a_connection_given_back_or_lost() -> None:
    accepted: list[asyncio.StreamWriter] = []

    async def hold(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = Pool(port, most=2)
    # Given two connections taken (the cap)
    first, second = await pool.take(), await pool.take()
    # When a third message wants one, then it waits, and no third connection opens
    third = asyncio.create_task(pool.take())
    await asyncio.sleep(0.2)
    assert not third.done()
    assert (pool.open, len(accepted)) == (2, 2)
    # Until one is given back: the waiting message gets that very connection
    await pool.give(first)
    assert await asyncio.wait_for(third, 5) is first
    # And a lost connection frees its place for a new one
    fourth = asyncio.create_task(pool.take())
    await asyncio.sleep(0.1)
    assert not fourth.done()
    await pool.lose(second)
    await asyncio.wait_for(fourth, 5)
    assert pool.open == 2
    pool.close()
    for writer in accepted:
        writer.close()
    server.close()
    await server.wait_closed()
