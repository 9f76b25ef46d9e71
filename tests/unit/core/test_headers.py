from __future__ import annotations

import pytest

from setu.errors import InvalidInput
from setu.headers import (
    MESSAGE_ID,
    ProduceHeaders,
    check_id,
    check_sequence,
    parse_produce_headers,
)


def parse(*pairs: tuple[str, str], grouped: bool = False) -> ProduceHeaders:
    return parse_produce_headers(list(pairs), grouped=grouped)


@pytest.mark.parametrize(
    "spelling", ["X_MESSAGE_ID", "x-message-id", "X-Message-Id", "x_message_id"]
)
def test_both_spellings_in_any_case_name_the_message_id(spelling: str) -> None:
    assert parse((spelling, "m1")).message_id == "m1"


def test_identity_and_extra_headers_are_separated() -> None:
    # Given a full set of identity headers and two of the producer's own
    got = parse(
        ("host", "example"),
        ("x-message-id", "m1"),
        ("x-group-id", "g1"),
        ("x-producer-id", "p1"),
        ("x-sequence-id", "42"),
        ("x-trace-id", "t-9"),
        ("X_TENANT", "acme"),
        grouped=True,
    )
    # Then identity is parsed and only X headers are kept, in order, under their own names
    assert got == ProduceHeaders(
        "m1", "g1", "p1", 42, (("x-trace-id", "t-9"), ("X_TENANT", "acme"))
    )


@pytest.mark.parametrize(
    ("pairs", "grouped", "message"),
    [
        ((), False, "X_MESSAGE_ID is required"),
        ((("x-message-id", ""),), False, "X_MESSAGE_ID is required"),
        ((("x-message-id", "m" * 101),), False, "at most 100"),
        ((("x-message-id", "m"),), True, "X_GROUP_ID is required"),
        ((("x-message-id", "m"), ("x-group-id", "g" * 101)), True, "at most 100"),
        ((("x-message-id", "m"), ("x-producer-id", "p")), False, "go together"),
        ((("x-message-id", "m"), ("x-sequence-id", "1")), False, "go together"),
        (
            (("x-message-id", "m"), ("x-producer-id", "p"), ("x-sequence-id", "-1")),
            False,
            "integer",
        ),
        (
            (("x-message-id", "m"), ("x-producer-id", "p"), ("x-sequence-id", "1.5")),
            False,
            "integer",
        ),
        (
            (("x-message-id", "m"), ("x-producer-id", "p"), ("x-sequence-id", str(2**63))),
            False,
            "integer",
        ),
        ((("x-message-id", "a"), ("X_MESSAGE_ID", "b")), False, "twice"),
        ((("x-message-id", "m"), ("x-delivery-attempt", "1")), False, "set by Setu"),
    ],
)
def test_broken_rules_are_refused(
    pairs: tuple[tuple[str, str], ...], grouped: bool, message: str
) -> None:
    with pytest.raises(InvalidInput, match=message):
        parse(*pairs, grouped=grouped)


def test_group_id_is_optional_on_an_ungrouped_topic() -> None:
    assert parse(("x-message-id", "m")).group_id is None


def test_largest_sequence_is_accepted() -> None:
    got = parse(("x-message-id", "m"), ("x-producer-id", "p"), ("x-sequence-id", str(2**63 - 1)))
    assert got.sequence_id == 2**63 - 1


@pytest.mark.parametrize("value", ["m1\r\nAuthorization: Bearer x", "m1\n", "m\x00", "m\x7f"])
def test_an_id_with_a_control_character_is_refused(value: str) -> None:
    # Ids go out as header values on every webhook call: CR/LF would inject headers there
    with pytest.raises(InvalidInput, match="control characters"):
        check_id(MESSAGE_ID, value, required=True)


@pytest.mark.parametrize("value", ["1_000", " 7", "7 ", "+7", "\u0663", "7\n"])
def test_a_sequence_id_is_plain_ascii_digits(value: str) -> None:
    with pytest.raises(InvalidInput):
        check_sequence(value)


def test_plain_sequence_ids_still_pass() -> None:
    assert check_sequence("42") == 42
    assert check_sequence(42) == 42
