"""The delivery benchmark's own setup."""

from __future__ import annotations

from bench.delivery import BODY, FILTER
from setu.envelope import Envelope
from setu.policies import accepts, parse_filter


def test_every_message_of_the_filtered_row_passes_its_body_filter() -> None:
    # Else the row would deliver nothing and measure only the filter's refusals
    assert accepts(parse_filter(FILTER), Envelope("m1", BODY, group_id="g1"))
