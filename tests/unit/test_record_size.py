"""Sizing records on the wire and cutting a dead-letter record to a topic's limit."""

from __future__ import annotations

import pytest

from retrylib.errors import ConfigError
from retrylib.kafka.record_size import (
    BATCH_OVERHEAD_BYTES,
    HEADER_OVERHEAD_BYTES,
    LIBRDKAFKA_MESSAGE_MAX_BYTES,
    MIN_RECORD_LIMIT_BYTES,
    RECORD_OVERHEAD_BYTES,
    fit,
    largest_record,
    producer_batch_bytes,
    producer_limit,
    wire_size,
)
from retrylib.retry import headers as h

FRAMING = BATCH_OVERHEAD_BYTES + RECORD_OVERHEAD_BYTES
OWN = [(h.ID, b"0" * 32), (h.DEAD_LETTER_REASON, b"record_too_large")]
USER = [("trace-id", b"t" * 100), ("tenant", b"acme")]


def _header_bytes(headers) -> int:
    return sum(HEADER_OVERHEAD_BYTES + len(n.encode()) + len(v or b"") for n, v in headers)


def test_wire_size_counts_key_value_headers_and_framing() -> None:
    headers = [("é", b"12"), ("n", None)]
    # "é" is two bytes of UTF-8.
    expected = FRAMING + 3 + 5 + (HEADER_OVERHEAD_BYTES + 2 + 2) + (HEADER_OVERHEAD_BYTES + 1)
    assert wire_size(b"key", b"value", headers) == expected


def test_wire_size_of_an_empty_record_is_its_framing() -> None:
    assert wire_size(None, None, []) == FRAMING


def test_wire_size_rejects_every_record_the_broker_or_librdkafka_was_seen_to_refuse() -> None:
    # Measured (module docstring): a topic of 200,000 refused a value of 199,930 alone;
    # librdkafka (message.max.bytes 1,000,000) refused 999,965 bytes of value, and 999,769
    # with a 100-byte key and three headers of 10 + 20 bytes.
    assert wire_size(None, b"x" * 199_930, []) > 200_000
    assert wire_size(None, b"x" * 999_965, []) > LIBRDKAFKA_MESSAGE_MAX_BYTES
    three = [("h" * 10, b"v" * 20)] * 3
    assert wire_size(b"k" * 100, b"x" * 999_769, three) > LIBRDKAFKA_MESSAGE_MAX_BYTES


def test_largest_record_is_the_smaller_limit() -> None:
    assert largest_record(1_000_000, 200_000) == 200_000
    assert largest_record(1_000_000, 1_048_588) == 1_000_000


def test_producer_limit_reads_message_max_bytes_or_librdkafkas_default() -> None:
    assert producer_limit({}) == LIBRDKAFKA_MESSAGE_MAX_BYTES
    assert producer_limit({"message.max.bytes": "2000000"}) == 2_000_000


def test_producer_limit_names_a_bad_option() -> None:
    with pytest.raises(ConfigError, match=r"'message.max.bytes' must be a whole number.*'1MB'"):
        producer_limit({"message.max.bytes": "1MB"})


def test_producer_batch_bytes_only_when_a_topic_takes_less_than_a_batch() -> None:
    assert producer_batch_bytes({}, {"a": 1_048_588, "b": 1_048_588}) is None
    assert producer_batch_bytes({}, {"a": 1_048_588, "b": 200_000}) == 200_000 - 61
    assert producer_batch_bytes({"batch.size": "100000"}, {"a": 200_000}) is None
    assert producer_batch_bytes({}, {}) is None


def test_fit_leaves_a_record_that_fits_as_it_is() -> None:
    headers = [*USER, *OWN]
    size = wire_size(b"k", b"v" * 100, headers)
    fitted = fit(b"k", b"v" * 100, headers, size)
    assert (fitted.key, fitted.value, fitted.headers) == (b"k", b"v" * 100, headers)
    assert not fitted.cut
    assert fitted.bytes == fitted.original_bytes == size


def test_fit_cuts_the_value_and_marks_its_original_length() -> None:
    value = bytes(range(256)) * 400  # 102,400 bytes
    limit = 50_000
    fitted = fit(b"key", value, [*USER, *OWN], limit)
    marker = (h.VALUE_TRUNCATED, b"102400")
    assert fitted.headers == [*USER, *OWN, marker]
    assert fitted.key == b"key"
    assert value.startswith(fitted.value)
    assert fitted.bytes == limit  # cut to the byte: as much of the value as fits
    assert fitted.original_bytes == wire_size(b"key", value, [*USER, *OWN])
    assert fitted.cut


def test_fit_drops_the_records_own_headers_last_first_when_the_value_is_not_enough() -> None:
    big_user = [("a", b"1" * 10_000), ("b", b"2" * 10_000), ("c", b"3" * 10_000)]
    limit = FRAMING + _header_bytes([*big_user[:1], *OWN]) + 200
    fitted = fit(b"k", b"v" * 5_000, [*big_user, *OWN], limit)
    assert fitted.value == b""
    assert fitted.headers == [
        big_user[0],
        *OWN,
        (h.VALUE_TRUNCATED, b"5000"),
        (h.HEADERS_DROPPED, b"2"),
    ]
    assert fitted.bytes <= limit


def test_fit_cuts_the_key_when_nothing_else_is_left_and_never_retrylibs_headers() -> None:
    key = b"k" * 40_000
    fitted = fit(key, b"v" * 10, [*USER, *OWN], MIN_RECORD_LIMIT_BYTES)
    assert fitted.value == b""
    assert fitted.headers == [
        *OWN,
        (h.VALUE_TRUNCATED, b"10"),
        (h.HEADERS_DROPPED, b"2"),
        (h.KEY_TRUNCATED, b"40000"),
    ]
    assert key.startswith(fitted.key) and 0 < len(fitted.key) < len(key)
    assert fitted.bytes == MIN_RECORD_LIMIT_BYTES


def test_fit_marks_only_what_it_cut() -> None:
    # A tombstone with a large key: no value to cut, no headers of the record's own.
    fitted = fit(b"k" * 30_000, None, OWN, MIN_RECORD_LIMIT_BYTES)
    assert fitted.value is None
    assert fitted.headers == [*OWN, (h.KEY_TRUNCATED, b"30000")]


def test_fit_raises_when_retrylibs_headers_alone_do_not_fit() -> None:
    with pytest.raises(ValueError, match=r"retrylib's own headers take \d+ bytes.*limit of 100"):
        fit(b"k", b"v" * 1_000, OWN, 100)


def test_min_limit_holds_the_largest_dead_letter_headers() -> None:
    # Every bounded header at its bound, the longest topic name Kafka allows, 20-digit numbers.
    widest = [
        (h.ID, b"0" * 32),
        (h.ATTEMPT, b"9" * 20),
        (h.NOT_BEFORE, b"9" * 20),
        (h.ORIGIN_TOPIC, b"t" * 249),
        (h.ORIGIN_PARTITION, b"9" * 20),
        (h.ORIGIN_OFFSET, b"9" * 20),
        (h.ORIGIN_TIMESTAMP, b"9" * 20),
        (h.FIRST_FAILURE, b"9" * 20),
        (h.LAST_FAILURE, b"9" * 20),
        (h.ERROR_CLASS, b"c" * h.MAX_ERROR_MESSAGE_BYTES),
        (h.ERROR_MESSAGE, b"m" * h.MAX_ERROR_MESSAGE_BYTES),
        (h.ATTEMPTS, b"9" * 20),
        (h.DEAD_LETTER_REASON, b"r" * 64),
        (h.ERROR_STACK_TRACE, b"s" * h.MAX_STACK_TRACE_BYTES),
    ]
    fitted = fit(b"k" * 100_000, b"v" * 100_000, [*USER, *widest], MIN_RECORD_LIMIT_BYTES)
    assert fitted.bytes <= MIN_RECORD_LIMIT_BYTES
    assert fitted.headers[: len(widest)] == widest
