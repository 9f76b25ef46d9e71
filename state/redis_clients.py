"""How every Setu process connects to Redis: the server ``SETU_REDIS_URL`` names, or the
primary that a group of Sentinels names (``SETU_REDIS_SENTINELS``), asked again after every
failed connection, so a failover moves every client to the promoted replica by itself.

A replica promoted by Sentinel may lack its old primary's last writes (replication is
asynchronous): Setu keeps nothing in Redis that it cannot rebuild (docs/design.md §4).

An asyncio client holds at most ``SETU_REDIS_MAX_CONNECTIONS`` connections; a command that
finds them all busy waits for one (up to ``POOL_WAIT_S``) instead of failing at once, which is
what redis-py's default pool does past its 100: a worker serving a hundred subscriptions asked
for more at a takeover, and every refused command stopped a subscription.
"""

from __future__ import annotations

import asyncio
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.client
import redis.asyncio.sentinel
import redis.sentinel
from redis.connection import parse_url

from setu.settings import Settings


def sentinel_addresses(text: str) -> list[tuple[str, int]]:
    """``"host:port,host:port"`` as pairs; raises ValueError naming a bad entry."""
    out = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        host, _, port = item.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"SETU_REDIS_SENTINELS: {item!r} is not host:port")
        out.append((host.strip("[]"), int(port)))
    if not out:
        raise ValueError("SETU_REDIS_SENTINELS names no Sentinel")
    return out


def primary_options(url: str) -> dict[str, Any]:
    """What ``url`` says of connections besides where to connect: database, credentials,
    TLS and its options (a primary found through Sentinel has its own address)."""
    options = parse_url(url)
    for where in ("host", "port", "path", "connection_class"):
        options.pop(where, None)
    if url.startswith("rediss://"):
        options["ssl"] = True
    return options


def _sentinel_kwargs(settings: Settings, timeouts: dict[str, Any]) -> dict[str, Any]:
    kwargs = dict(timeouts)
    if settings.redis_sentinel_password is not None:
        kwargs["password"] = settings.redis_sentinel_password.get_secret_value()
    return kwargs


# How long a command waits for a free connection of its client's pool before it fails.
POOL_WAIT_S = 20.0


class _BlockingSentinelPool(
    redis.asyncio.sentinel.SentinelConnectionPool,  # type: ignore[type-arg]
    redis.asyncio.BlockingConnectionPool,  # type: ignore[type-arg]
):
    """The Sentinel-named primary's pool, waiting for a free connection as
    ``BlockingConnectionPool`` does (the Sentinel pool only finds the address)."""


# Pipelines a PipelinedRedis has out at once (each holds a connection while it is).
PIPELINES_IN_FLIGHT = 4


class PipelinedRedis(redis.asyncio.Redis):  # type: ignore[type-arg]
    """A client whose commands, from whatever task, go to Redis together: those asked in
    one turn of the event loop are sent in one pipeline (not a transaction: each succeeds or
    fails alone, in the order asked), on one connection. A delivery worker serving a thousand
    subscriptions asked Redis for thousands of small things a second (state writes, outcome
    trims, attempt logs, shares), one round trip and one pooled connection each: its hundred
    connections were all waiting on a loop that could not read their answers fast enough,
    and commands that waited past ``POOL_WAIT_S`` failed their runners. redis-py pipelines
    only what one caller puts in one pipeline; this gathers across callers, the commands of
    a caller's own ``pipeline(transaction=False)`` included (in a row, in their order). Not
    for blocking commands (``BLPOP``, ``XREAD BLOCK``): they would hold every command sent
    with them. Transactions (and ``WATCH``) take a connection of their own, as on any
    client."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._asked: list[tuple[tuple[Any, ...], dict[str, Any], asyncio.Future[Any]]] = []
        self._sending: set[asyncio.Task[None]] = set()
        self._due = False  # a send of what is asked is scheduled

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        [answer] = self._ask([(args, options)])
        return await answer

    def pipeline(self, transaction: bool = True, shard_hint: str | None = None) -> Any:
        if transaction:
            return super().pipeline(transaction, shard_hint)
        return _GatheredPipeline(self, shard_hint)

    async def gathered(self, commands: list[tuple[tuple[Any, ...], dict[str, Any]]]) -> list[Any]:
        """Answers to ``commands``, sent in a row with what else is asked: each an answer or
        the exception Redis (or the connection) gave it."""
        return await asyncio.gather(*self._ask(commands), return_exceptions=True)

    def _ask(
        self, commands: list[tuple[tuple[Any, ...], dict[str, Any]]]
    ) -> list[asyncio.Future[Any]]:
        """Queues ``commands`` for the next pipeline, in their order; their answers to come."""
        loop = asyncio.get_running_loop()
        answers: list[asyncio.Future[Any]] = []
        for args, options in commands:
            answer: asyncio.Future[Any] = loop.create_future()
            self._asked.append((args, options, answer))
            answers.append(answer)
        self._schedule()
        return answers

    def _schedule(self) -> None:
        # While PIPELINES_IN_FLIGHT are out, what is asked waits for one to end and goes
        # with everything asked meanwhile: a loop that falls behind sends fewer, longer
        # pipelines instead of taking every connection of the pool.
        if self._asked and not self._due and len(self._sending) < PIPELINES_IN_FLIGHT:
            self._due = True
            asyncio.get_running_loop().call_soon(self._send_asked)

    def _send_asked(self) -> None:
        self._due = False
        asked, self._asked = self._asked, []
        if not asked:
            return
        # One pipeline, however long: Redis runs its commands in the order asked.
        task = asyncio.get_running_loop().create_task(self._send(asked))
        self._sending.add(task)
        task.add_done_callback(self._sent)

    def _sent(self, task: asyncio.Task[None]) -> None:
        self._sending.discard(task)
        self._schedule()

    async def _send(
        self, batch: list[tuple[tuple[Any, ...], dict[str, Any], asyncio.Future[Any]]]
    ) -> None:
        try:
            # A pipeline of redis-py's own (this client's would gather again).
            async with super().pipeline(transaction=False) as pipe:
                for args, options, _ in batch:
                    pipe.execute_command(*args, **options)
                answers = await pipe.execute(raise_on_error=False)
        except BaseException as exc:  # the connection failed: every command of it did
            for _, _, answer in batch:
                if not answer.done():
                    answer.set_exception(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        for (_, _, answer), result in zip(batch, answers, strict=True):
            if answer.done():  # its caller was cancelled meanwhile
                continue
            if isinstance(result, Exception):
                answer.set_exception(result)
            else:
                answer.set_result(result)


class _GatheredPipeline(redis.asyncio.client.Pipeline):  # type: ignore[type-arg]
    """A ``pipeline(transaction=False)`` of a :class:`PipelinedRedis`: its commands go with
    the client's other commands instead of on a connection of their own."""

    def __init__(self, client: PipelinedRedis, shard_hint: str | None) -> None:
        super().__init__(client.connection_pool, client.response_callbacks, False, shard_hint)
        self._client = client

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        if not self.command_stack or self.watching:
            return list(await super().execute(raise_on_error))
        if self.scripts:
            await self.load_scripts()
        try:
            answers = await self._client.gathered(list(self.command_stack))
        finally:
            await self.reset()
        if raise_on_error:
            for answer in answers:
                if isinstance(answer, Exception):
                    raise answer
        return answers


def async_redis(
    settings: Settings,
    url: str,
    max_connections: int | None = None,
    pipelined: bool = False,
    **timeouts: Any,
) -> redis.asyncio.Redis[bytes]:
    """An asyncio client of the Redis (or Sentinel-named primary) of ``settings``, whose
    commands wait for a connection when all of its pool's are busy (module doc), holding at
    most ``max_connections`` of them (None: ``SETU_REDIS_MAX_CONNECTIONS``); ``pipelined``:
    a :class:`PipelinedRedis`."""
    kind: Any = PipelinedRedis if pipelined else redis.asyncio.Redis
    pool = {
        "max_connections": max_connections or settings.redis_max_connections,
        "timeout": POOL_WAIT_S,
    }
    if not settings.redis_sentinels:
        blocking: Any = redis.asyncio.BlockingConnectionPool.from_url(url, **pool, **timeouts)
        # The client owns the pool, and closes it with itself. (types-redis predates from_pool.)
        plain: redis.asyncio.Redis[bytes] = kind.from_pool(blocking)
        return plain
    sentinel = redis.asyncio.sentinel.Sentinel(
        sentinel_addresses(settings.redis_sentinels),
        sentinel_kwargs=_sentinel_kwargs(settings, timeouts),
        **timeouts,
    )
    client: redis.asyncio.Redis[bytes] = sentinel.master_for(
        settings.redis_sentinel_master,
        redis_class=kind,
        connection_pool_class=_BlockingSentinelPool,
        **pool,
        **primary_options(url),
    )
    return client


def sync_redis(settings: Settings, url: str, **timeouts: Any) -> redis.Redis[bytes]:
    """A blocking client of the Redis (or Sentinel-named primary) of ``settings``."""
    if not settings.redis_sentinels:
        return redis.Redis.from_url(url, **timeouts)
    sentinel = redis.sentinel.Sentinel(
        sentinel_addresses(settings.redis_sentinels),
        sentinel_kwargs=_sentinel_kwargs(settings, timeouts),
        **timeouts,
    )
    client: redis.Redis[bytes] = sentinel.master_for(
        settings.redis_sentinel_master, **primary_options(url)
    )
    return client


async def close(client: redis.asyncio.Redis[bytes]) -> None:
    """Closes an asyncio client and its connections (a process's last step)."""
    await client.aclose()  # type: ignore[attr-defined]  # types-redis predates aclose
