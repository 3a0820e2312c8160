"""The test suite's model of Kafka's Java partitioner (`helpers.java_partition`), which the
delay router's tests hold its forwarded records to, against Kafka's own murmur2 vectors."""

from __future__ import annotations

import pytest
from helpers import java_murmur2, java_partition

# Kafka's clients/src/test/java/org/apache/kafka/common/utils/UtilsTest.java, testMurmur2.
KAFKA_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


@pytest.mark.parametrize(("key", "hashed"), KAFKA_VECTORS.items())
def test_murmur2_gives_kafkas_hash(key: bytes, hashed: int) -> None:
    assert java_murmur2(key) == hashed


@pytest.mark.parametrize(("key", "hashed"), KAFKA_VECTORS.items())
def test_the_partition_is_the_positive_hash_modulo_the_partitions(key: bytes, hashed: int) -> None:
    # Utils.toPositive clears the sign bit; it does not negate.
    assert java_partition(key, 3) == (hashed & 0x7FFFFFFF) % 3
