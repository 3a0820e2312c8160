"""Kafka headers in Arrow turned into each record's (key, value) pairs, column by column."""

from __future__ import annotations

import pyarrow as pa

from retrylib.kafka.arrow_records import HEADERS_TYPE, header_lists

ROWS = [
    [{"key": "a", "value": b"1"}],
    [],
    [{"key": "b", "value": None}, {"key": "b", "value": b"2"}],
    [{"key": "c", "value": b""}],
]
PAIRS = [[("a", b"1")], [], [("b", None), ("b", b"2")], [("c", b"")]]


def test_each_row_gets_its_pairs_in_order_duplicates_and_null_values_kept() -> None:
    assert header_lists(pa.array(ROWS, HEADERS_TYPE)) == PAIRS


def test_a_slice_counts_from_its_own_first_row() -> None:
    column = pa.array(ROWS, HEADERS_TYPE)
    assert header_lists(column.slice(2, 2)) == PAIRS[2:]
    assert header_lists(column.slice(1, 0)) == []


def test_a_null_row_has_no_headers() -> None:
    column = pa.array([ROWS[0], None, ROWS[2]], HEADERS_TYPE)
    assert header_lists(column) == [PAIRS[0], [], PAIRS[2]]
    assert header_lists(column.slice(1)) == [[], PAIRS[2]]


def test_a_chunked_column_reads_as_one() -> None:
    chunked = pa.chunked_array([pa.array(ROWS[:1], HEADERS_TYPE), pa.array(ROWS[1:], HEADERS_TYPE)])
    assert header_lists(chunked) == PAIRS
