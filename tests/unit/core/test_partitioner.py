"""The murmur2 partitioner matches Kafka's Java client byte for byte.

Expected values come from org.apache.kafka.common.utils.Utils.murmur2 and toPositive(h) % 6.
"""

from __future__ import annotations

import pytest

from setu.partitioner import murmur2, partition_for


@pytest.mark.parametrize(
    ("key", "expected_hash", "expected_partition_of_6"),
    [
        ("", 275646681, 3),
        ("a", -1563381124, 4),
        ("ab", 316155434, 2),
        ("abc", 479470107, 3),
        ("abcd", -1323649548, 2),
        ("group-1", -1050602869, 1),
        ("21", -973932308, 0),
        ("foobar", -790332482, 0),
        ("0123456789abcdef!", -838087196, 0),
        ("ünïcødé", 2147241326, 2),
    ],
)
def test_hash_and_partition_match_the_java_client(
    key: str, expected_hash: int, expected_partition_of_6: int
) -> None:
    data = key.encode()
    assert murmur2(data) == expected_hash
    assert partition_for(data, 6) == expected_partition_of_6
