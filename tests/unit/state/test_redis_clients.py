"""How Setu reaches Redis behind Sentinel: the Sentinels' addresses, and what of
SETU_REDIS_URL still counts when Sentinel names the primary."""

from __future__ import annotations

import pytest

from state.redis_clients import primary_options, sentinel_addresses


def test_sentinels_are_host_port_pairs() -> None:
    assert sentinel_addresses("s1:26379, s2:26380,[::1]:26381") == [
        ("s1", 26379),
        ("s2", 26380),
        ("::1", 26381),
    ]


@pytest.mark.parametrize("text", ["", "s1", "s1:port", ":26379"])
def test_a_bad_sentinel_list_is_refused_by_name(text: str) -> None:
    with pytest.raises(ValueError, match="SETU_REDIS_SENTINELS"):
        sentinel_addresses(text)


def test_the_url_gives_database_credentials_and_tls_not_the_address() -> None:
    options = primary_options("rediss://user:pw@ignored:6380/3?ssl_ca_certs=/ca.pem")
    assert options == {
        "username": "user",
        "password": "pw",
        "db": 3,
        "ssl": True,
        "ssl_ca_certs": "/ca.pem",
    }
    assert primary_options("redis://h/0") == {"db": 0}
