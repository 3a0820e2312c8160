"""Produce units without Spark or a broker: where Spark puts a unit, how a task's rows are
cut into units, and which control-topic records count as a unit's marker."""

from __future__ import annotations

import pyarrow as pa
import pytest

from retrylib.batch.produce_units import produce_plan, spark_hash_int, spread_keys
from retrylib.batch.routing_stage import task_counters
from retrylib.sinks.markers import marker_value, read_marker
from retrylib.sinks.outgoing_records import OUTGOING_SCHEMA
from retrylib.sinks.produce_units import ProducerSettings, _spool_units

# What Spark 4.2's `hash()` gives for these ints (read off `spark.range(-3, 6)`).
SPARK_HASHES = {
    -3: -1573329414,
    -2: -1160545675,
    -1: -1604776387,
    0: 933211791,
    1: -559580957,
    2: 1765031574,
    3: -1823081949,
    4: -397064898,
    5: 1023896466,
}
KEY, APP = b"s" * 32, "orders-0123456789ab"


def test_the_hash_is_sparks() -> None:
    assert {value: spark_hash_int(value) for value in SPARK_HASHES} == SPARK_HASHES


@pytest.mark.parametrize("units", [1, 2, 3, 7, 16, 200])
def test_each_unit_gets_a_partition_of_its_own(units: int) -> None:
    keys = spread_keys(units)
    assert [spark_hash_int(key) % units for key in keys] == list(range(units))


def _rows(units: list[int]) -> pa.RecordBatch:
    rows = [
        {
            "unit": unit,
            "seq": i,
            "topic": "t",
            "partition": None,
            "timestamp_ms": 1,
            "key": None,
            "value": f"{unit}-{i}".encode(),
            "headers": [],
        }
        for i, unit in enumerate(units)
    ]
    schema = pa.schema(
        [pa.field("unit", pa.int32()), pa.field("seq", pa.int64()), *OUTGOING_SCHEMA]
    )
    return pa.RecordBatch.from_pylist(rows, schema=schema)


def test_a_tasks_rows_are_cut_into_a_file_per_unit_in_order(tmp_path) -> None:
    batches = [_rows([0, 0, 3]), _rows([3, 3]), _rows([5])]
    spooled = {}
    for unit, path in _spool_units(iter(batches), str(tmp_path)):
        with pa.ipc.open_stream(path) as reader:
            table = reader.read_all()
        assert table.schema == OUTGOING_SCHEMA
        spooled[unit] = table.column("value").to_pylist()
    assert spooled == {0: [b"0-0", b"0-1"], 3: [b"3-2", b"3-0", b"3-1"], 5: [b"5-0"]}


def test_a_marker_is_signed_for_its_checkpoint_batch_and_unit() -> None:
    value = marker_value(KEY, APP, 12, 3)
    assert read_marker(KEY, APP, APP.encode(), value) == (12, 3)
    assert read_marker(b"x" * 32, APP, APP.encode(), value) is None  # another checkpoint's key
    assert read_marker(KEY, "orders-other", b"orders-other", value) is None


@pytest.mark.parametrize(
    "value",
    [b"1000000", b"13:3", b"13:3:" + b"0" * 32, b"12:4:" + marker_value(KEY, APP, 12, 3)[5:], b""],
)
def test_a_record_the_job_did_not_sign_is_no_marker(value: bytes) -> None:
    # Plain batch numbers (what a forwarded record planted before markers were signed), a
    # made-up signature, and a real signature moved to another unit.
    assert read_marker(KEY, APP, APP.encode(), value) is None


def test_the_batch_may_produce_once_its_tasks_last_record_read_ahead_is_due() -> None:
    texts = [
        '{"forwarded": 2, "not_before_ms": 1500}',
        '{"forwarded": 3}',
        '{"not_before_ms": 900}',
    ]

    counters, not_before_ms = task_counters(texts)

    assert counters == {"forwarded": 5} and not_before_ms == 1500


def test_the_produce_plan_waits_for_the_manifests_time() -> None:
    manifest = {"units": 2, "control_from": 7, "not_before_ms": 1500}
    settings = ProducerSettings("j", APP, "broker:9092", {}, {}, KEY)

    plan = produce_plan(settings, manifest, 4)

    assert (plan.batch_id, plan.units, plan.control_from, plan.not_before_ms) == (4, 2, 7, 1500)
    # A manifest an earlier version wrote has no time: nothing to wait for.
    del manifest["not_before_ms"]
    assert produce_plan(settings, manifest, 4).not_before_ms == 0
