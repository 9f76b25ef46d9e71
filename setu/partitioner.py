"""Kafka's Java-client murmur2 partitioner, for checking where a key must land.

Every producer in Setu partitions keyed records this way (librdkafka ``murmur2_random``, the
Java client's default), so a group sits on the same partition index in every tier.
"""

from __future__ import annotations

_M = 0x5BD1E995
_SEED = 0x9747B28C
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2``: a signed 32-bit hash of ``data``."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    full = length - (length & 3)
    for i in range(0, full, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    rest = length & 3
    if rest == 3:
        h ^= data[full + 2] << 16
    if rest >= 2:
        h ^= data[full + 1] << 8
    if rest >= 1:
        h ^= data[full]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner picks for a non-empty ``key``."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions
