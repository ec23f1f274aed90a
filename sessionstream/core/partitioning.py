"""Kafka's murmur2 partitioner, so the processor can check a command sits where it belongs.

Java clients, aiokafka and librdkafka's `murmur2_random` all place a key on
`(murmur2(key) & 0x7fffffff) % partitions`. A command found on another partition was
produced with another partitioner (librdkafka's default `consistent_random` is CRC32) and
would give its session a second writer; the processor dead-letters it instead.
"""

from __future__ import annotations

import functools

__all__ = ["murmur2", "partition_for"]

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's `Utils.murmur2` (seed 0x9747b28c), as an unsigned 32-bit int."""
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK
    n4 = length // 4
    for i in range(n4):
        k = int.from_bytes(data[4 * i : 4 * i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    rest = length % 4
    tail = 4 * n4
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h


@functools.lru_cache(maxsize=1 << 16)
def partition_for(key: bytes, partitions: int) -> int:
    """The partition every murmur2 producer picks for `key` (remembered for the 65,536 most
    recent keys: a session's commands come again and again)."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions
