"""Per-project produce quotas on the produce path (docs/security.md §6).

Each project may write at most its quota's messages/s and bytes/s, summed over every API
replica: the buckets live in Redis (``state/quota_buckets.py``). So that a project under its
quota does not pay a Redis round trip per request, an admitted request also leases 1/20 of a
second's worth, which this replica spends on the next requests for up to a second before it
asks again. Over the quota: 429 with ``Retry-After``, nothing written.

Projects without a quota (and no default in the settings) cost one dictionary lookup. When
Redis does not answer, the request is admitted (quotas protect capacity; they must not take
produce down with Redis), logged at most every 10 s and counted in
``setu_api_quota_checks_failed_total``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from redis.exceptions import RedisError

from api.ttl_cache import LoadingCache
from setu.errors import RateLimited
from setu.model import ProduceQuota
from state.quota_buckets import QuotaBuckets

log = logging.getLogger(__name__)

# An admitted request leases this share of a second's quota for the next ones.
LEASE_SHARE = 0.05
LEASE_TTL_S = 1.0
_WARN_EVERY_S = 10.0
# A take's outcome when Redis did not answer (the request was admitted unchecked).
_UNCHECKED = object()


@dataclass(slots=True)
class _Lease:
    messages: int
    nbytes: int
    until: float


class QuotaGate:
    def __init__(
        self,
        buckets: QuotaBuckets,
        quota_of: Callable[[str], Awaitable[ProduceQuota]],
        *,
        cached_quota_of: Callable[[str], ProduceQuota | None] = lambda _: None,
        on_unchecked: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._buckets = buckets
        self._quota_of = quota_of
        self._cached_quota_of = cached_quota_of
        self._on_unchecked = on_unchecked
        self._clock = clock
        self._leases: dict[str, _Lease] = {}
        # The Redis take in flight per project: requests that find the lease spent wait for it
        # rather than each leasing a share of their own (concurrent takes drained the bucket
        # and refused a project far under its quota).
        self._taking: dict[str, asyncio.Future[object]] = {}
        self._warned_at = -math.inf

    async def admit(self, project: str, messages: int, nbytes: int) -> None:
        """Returns when the project may write ``messages`` messages of ``nbytes`` bytes in all;
        raises RateLimited (429) otherwise."""
        quota = await self._quota_of(project)
        by_count, by_size = quota.messages_per_second, quota.bytes_per_second
        if by_count is None and by_size is None:
            return
        if self._spend_lease(project, quota, messages, nbytes, self._clock()):
            return
        while (taking := self._taking.get(project)) is not None:
            shared = await asyncio.shield(taking)
            if shared is _UNCHECKED:
                return  # Redis did not answer the take just made: admitted the same way
            if isinstance(shared, RateLimited):
                raise RateLimited(str(shared), retry_after_s=shared.retry_after_s)
            if self._spend_lease(project, quota, messages, nbytes, self._clock()):
                return
        done: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self._taking[project] = done
        outcome: object = None
        try:
            if not await self._take(project, quota, messages, nbytes):
                outcome = _UNCHECKED
        except RateLimited as refused:
            outcome = refused
            raise
        finally:
            del self._taking[project]
            done.set_result(outcome)

    async def _take(self, project: str, quota: ProduceQuota, messages: int, nbytes: int) -> bool:
        """Asks Redis for the request plus a lease (what is left of the current lease stays);
        raises RateLimited when refused; False when Redis did not answer (admitted)."""
        by_count, by_size = quota.messages_per_second, quota.bytes_per_second
        extra_m = int((by_count or 0) * LEASE_SHARE)
        extra_b = int((by_size or 0) * LEASE_SHARE)
        try:
            grant = await self._buckets.take(project, quota, messages, nbytes, extra_m, extra_b)
        except (RedisError, OSError) as exc:
            self._unchecked(project, exc)
            return False
        if not grant.admitted:
            self._leases.pop(project, None)
            raise RateLimited(
                f"project {project!r} is over its produce quota ({describe(quota)}); "
                f"retry after {grant.wait_ms / 1000:.3g} s",
                retry_after_s=max(1, math.ceil(grant.wait_ms / 1000)),
            )
        now = self._clock()
        lease = self._leases.get(project)
        kept_m, kept_b = (lease.messages, lease.nbytes) if lease and lease.until > now else (0, 0)
        self._leases[project] = _Lease(
            kept_m + grant.extra_messages, kept_b + grant.extra_bytes, now + LEASE_TTL_S
        )
        return True

    def admit_now(self, project: str, messages: int, nbytes: int) -> bool:
        """:meth:`admit` where it needs neither Redis nor the store: True when admitted; False
        when the caller must ``await admit(...)`` (which may still admit)."""
        quota = self._cached_quota_of(project)
        if quota is None:
            return False
        if quota.messages_per_second is None and quota.bytes_per_second is None:
            return True
        return self._spend_lease(project, quota, messages, nbytes, self._clock())

    def _spend_lease(
        self, project: str, quota: ProduceQuota, messages: int, nbytes: int, now: float
    ) -> bool:
        """Spends this replica's lease of the project's quota, if it covers the request."""
        lease = self._leases.get(project)
        if (
            lease is not None
            and lease.until > now
            and (quota.messages_per_second is None or lease.messages >= messages)
            and (quota.bytes_per_second is None or lease.nbytes >= nbytes)
        ):
            lease.messages -= messages
            lease.nbytes -= nbytes
            return True
        return False

    def _unchecked(self, project: str, exc: Exception) -> None:
        self._on_unchecked()
        now = self._clock()
        if now - self._warned_at >= _WARN_EVERY_S:
            self._warned_at = now
            log.warning("produce quota of %s not checked (Redis: %s): admitted", project, exc)


def describe(quota: ProduceQuota) -> str:
    parts = []
    if quota.messages_per_second is not None:
        parts.append(f"{quota.messages_per_second:g} messages/s")
    if quota.bytes_per_second is not None:
        parts.append(f"{quota.bytes_per_second:g} bytes/s")
    return ", ".join(parts)


class ProjectQuotas:
    """Each project's quota, its unset rates taken from ``default``; read from the store at
    most every 5 s (and at once on this replica after it changes one)."""

    def __init__(
        self, load: Callable[[str], Awaitable[ProduceQuota | None]], default: ProduceQuota
    ) -> None:
        self._default = default

        async def effective(project: str) -> ProduceQuota:
            found = await load(project)
            return (found or ProduceQuota()).or_else(default)

        self._cache: LoadingCache[str, ProduceQuota] = LoadingCache(
            effective, ttl_s=5.0, negative_ttl_s=1.0
        )

    async def of(self, project: str) -> ProduceQuota:
        return await self._cache.get(project) or self._default

    def cached(self, project: str) -> ProduceQuota | None:
        """The project's quota if it is in memory and fresh, else None (unknown)."""
        fresh, quota = self._cache.cached(project)
        return (quota or self._default) if fresh else None

    def invalidate(self, project: str) -> None:
        self._cache.invalidate(project)
