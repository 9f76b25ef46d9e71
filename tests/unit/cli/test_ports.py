from __future__ import annotations

import socket
from pathlib import Path

import pytest

from cli.ports import PortBook, PortBusy, choose_port, free_ports, is_free, pick

FREE = {19092, 6379, 8080}


def free(port: int) -> bool:
    return port in FREE


@pytest.mark.parametrize(
    ("explicit", "remembered", "default", "expected"),
    [
        (19092, None, 9092, 19092),  # asked for and free
        (None, 19092, 9092, 19092),  # last run's port beats the usual one
        (None, 29092, 6379, 6379),  # last run's port is taken now: the usual one
        (None, None, 8080, 8080),
        (None, None, 9092, None),  # usual one taken: let the OS choose
        (None, None, None, None),  # nothing preferred (tests): let the OS choose
    ],
)
def test_port_choice(
    explicit: int | None, remembered: int | None, default: int | None, expected: int | None
) -> None:
    assert choose_port(explicit, remembered, default, free) == expected


def test_an_explicit_busy_port_is_an_error_not_a_surprise() -> None:
    with pytest.raises(PortBusy, match="9092"):
        choose_port(9092, 19092, 6379, free)


def test_a_listening_port_is_busy_and_a_closed_one_is_free() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert not is_free(port)
    assert is_free(port)


def test_pick_never_hands_out_a_port_twice() -> None:
    first = pick(None, None, None, set())
    second = pick(None, first, None, {first})
    assert second != first


def test_port_book_remembers_between_runs(tmp_path: Path) -> None:
    book = PortBook(tmp_path / "dev" / "ports.json")
    assert book.load() == {}
    book.save({"kafka": 19092, "redis": 16379})
    assert PortBook(tmp_path / "dev" / "ports.json").load() == {"kafka": 19092, "redis": 16379}


def test_a_damaged_port_book_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "ports.json"
    path.write_text("{not json")
    assert PortBook(path).load() == {}


def test_free_ports_are_all_different_even_when_the_system_repeats_one() -> None:
    # Given a system that hands out the same port twice in a row
    handed = iter([5001, 5001, 5002, 5001, 5003])
    # Then free_ports asks again until each port differs
    assert free_ports(3, lambda: next(handed)) == [5001, 5002, 5003]
