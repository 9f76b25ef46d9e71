"""Unknown keys cost the database one query per cache time, not one per id (api/auth.py):
random well-formed key ids are a cheap way to load the database otherwise."""

from __future__ import annotations

from typing import cast

import pytest

from api.auth import Authenticator
from setu.access import ApiKey, Role, digest, new_token
from setu.errors import Unauthorized
from state.api_keys import KeyStore


class Keys:
    """What the authenticator asks of the key store, counting its queries."""

    def __init__(self) -> None:
        self.keys: dict[str, ApiKey] = {}
        self.finds = 0
        self.id_queries = 0

    def add(self) -> str:
        key_id, token = new_token()
        self.keys[key_id] = ApiKey(key_id, "k", Role.VIEWER, "p", None, digest(token), 0)
        return token

    def find(self, key_id: str) -> ApiKey | None:
        self.finds += 1
        return self.keys.get(key_id)

    def ids(self) -> frozenset[str]:
        self.id_queries += 1
        return frozenset(self.keys)

    def touch(self, key_id: str, at_ms: int) -> None:
        pass


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


def authenticator(keys: Keys, clock: Clock) -> Authenticator:
    return Authenticator(cast(KeyStore, keys), None, ttl_s=2.0, clock=clock)


@pytest.mark.finding("L7")
async def test_a_flood_of_unknown_key_ids_costs_one_query_per_cache_time() -> None:
    keys, clock = Keys(), Clock()
    auth = authenticator(keys, clock)
    known = keys.add()
    # When a thousand distinct, well-formed, unknown keys are tried within the cache time
    for _ in range(1000):
        with pytest.raises(Unauthorized):
            await auth.principal(f"Bearer {new_token()[1]}")
    # Then each is refused, and the database was asked once for the ids and never per key
    assert (keys.id_queries, keys.finds) == (1, 0)
    # And a real key still works
    assert (await auth.principal(f"Bearer {known}")).role is Role.VIEWER
    # And after the cache time the ids are asked for once more
    clock.now += 2.5
    with pytest.raises(Unauthorized):
        await auth.principal(f"Bearer {new_token()[1]}")
    assert keys.id_queries == 2


async def test_a_key_made_elsewhere_is_usable_within_the_cache_time() -> None:
    keys, clock = Keys(), Clock()
    auth = authenticator(keys, clock)
    with pytest.raises(Unauthorized):
        await auth.principal(f"Bearer {new_token()[1]}")
    # Given a key made on another replica just after this one asked for the ids
    token = keys.add()
    with pytest.raises(Unauthorized):
        await auth.principal(f"Bearer {token}")
    # Then it works once the cache time has passed
    clock.now += 2.5
    assert (await auth.principal(f"Bearer {token}")).project == "p"


async def test_a_key_made_here_is_usable_at_once() -> None:
    keys, clock = Keys(), Clock()
    auth = authenticator(keys, clock)
    with pytest.raises(Unauthorized):
        await auth.principal(f"Bearer {new_token()[1]}")
    token = keys.add()
    auth.learn(next(iter(keys.keys)))
    assert (await auth.principal(f"Bearer {token}")).project == "p"
