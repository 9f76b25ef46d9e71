"""Contract tests: the same tests on an adapter's in-memory stub and on its real Redis adapter.

A test module writes a table of its backends, backend name -> factory, and gets one fixture
parametrized over the table (as dramatiq's tests run on each broker of theirs)::

    store = contract({"stub": lambda redis: StubStore(), "redis": lambda redis: RedisStore(...)})

Each factory is given a :class:`Backing`: what an adapter is built on. The stub needs none of
it; a Redis adapter takes clients of the test's Redis, opened on demand and closed after the
test, and may name a fresh project whose keys are deleted after the test, or keys to delete
before and after it."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, TypeVar

import pytest
import pytest_asyncio
import redis
from redis import asyncio as aioredis

from state import keys

T = TypeVar("T")


class Backing:
    """The test's Redis (``redis_url``, tests/conftest.py), for one test."""

    def __init__(self, redis_url: str) -> None:
        self.redis_url = redis_url
        self._client: redis.Redis[bytes] | None = None
        self._async_client: aioredis.Redis[bytes] | None = None
        self._subscriptions: list[tuple[str, str]] = []
        self._keys: list[str] = []

    def client(self) -> redis.Redis[bytes]:
        """A client of the test's Redis (the same one each time)."""
        if self._client is None:
            self._client = redis.Redis.from_url(self.redis_url)
        return self._client

    def async_client(self) -> aioredis.Redis[bytes]:
        """An asyncio client of the test's Redis (the same one each time)."""
        if self._async_client is None:
            self._async_client = aioredis.Redis.from_url(self.redis_url)
        return self._async_client

    def project(self, prefix: str, subscription: str = "s") -> str:
        """A fresh project name; the keys of its ``subscription`` are deleted after the test."""
        project = f"{prefix}{uuid.uuid4().hex[:10]}"
        self._subscriptions.append((project, subscription))
        return project

    def forget(self, *names: str) -> None:
        """Deletes the keys ``names`` now and again after the test."""
        self.client().delete(*names)
        self._keys.extend(names)

    async def close(self) -> None:
        """Deletes what the test left (through the asyncio client if the adapter used one),
        then closes the clients."""
        patterns = [keys.subscription_pattern(p, s) for p, s in self._subscriptions]
        if self._async_client is not None:
            for pattern in patterns:
                found = [k async for k in self._async_client.scan_iter(match=pattern)]
                if found:
                    await self._async_client.delete(*found)
            await self._async_client.aclose()  # type: ignore[attr-defined]
        elif patterns:
            for pattern in patterns:
                found = list(self.client().scan_iter(match=pattern))
                if found:
                    self.client().delete(*found)
        if self._client is not None:
            if self._keys:
                self._client.delete(*self._keys)
            self._client.close()


def contract(backends: Mapping[str, Callable[[Backing], T]]) -> Any:
    """A fixture parametrized over ``backends`` (its ids are their names, in order): it yields
    what each factory builds, and closes the backing after the test."""

    @pytest_asyncio.fixture(params=list(backends))
    async def backend(request: pytest.FixtureRequest, redis_url: str) -> AsyncIterator[T]:
        backing = Backing(redis_url)
        try:
            yield backends[request.param](backing)
        finally:
            await backing.close()

    return backend
