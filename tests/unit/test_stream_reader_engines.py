"""The retrylib_kafka stream reader plans the same batches whether the engine passes it start
offsets and read limits (Spark 4.2) or calls `latestOffset()` bare (Spark 4.0/4.1).

Kafka is a fake answering the reader's driver-side look-ups; no Spark, no broker.
"""

from __future__ import annotations

import json
import re

import pyarrow as pa
import pytest
from confluent_kafka import KafkaError, KafkaException
from helpers import FakeKafka, reader_for

from retrylib.errors import TopicError
from retrylib.kafka import arrow_records
from retrylib.kafka.arrow_records import KAFKA_SCHEMA
from retrylib.kafka.offsets import EARLIEST, LATEST, Offsets, offsets_from_json, offsets_to_json
from retrylib.source.kafka_source import KafkaStreamReader
from retrylib.source.lookups import KafkaLookups as _Metadata
from retrylib.source.lookups import TopicVanished
from retrylib.source.options import parse_source_options

P0, P1 = ("orders", 0), ("orders", 1)


def bare_engine_batches(reader: KafkaStreamReader, start: Offsets, triggers: int) -> list[int]:
    """Records per batch as Spark 4.0/4.1 plan them: `latestOffset()` bare, then
    `partitions(start, end)` for a batch whenever the end moved."""
    sizes = []
    for _ in range(triggers):
        end = offsets_from_json(reader.latestOffset())
        if end != start:
            reader.partitions(offsets_to_json(start), offsets_to_json(end))
            sizes.append(sum(end[key] - start.get(key, 0) for key in end))
            start = end
    return sizes


def test_bare_calls_cut_each_batch_to_max_offsets_per_trigger() -> None:
    reader = reader_for(FakeKafka({P0: 25, P1: 5}), maxOffsetsPerTrigger="10")

    assert bare_engine_batches(reader, {P0: 0, P1: 0}, triggers=5) == [10, 10, 10]


def test_bare_calls_start_a_new_query_where_initial_offset_says() -> None:
    kafka = FakeKafka({P0: 100, P1: 40})
    reader = reader_for(kafka, startingOffsets="latest", maxOffsetsPerTrigger="10")

    first = reader.latestOffset()  # Spark 4.0/4.1 ask for this before initialOffset()
    kafka.latest = {P0: 130, P1: 40}

    assert first == reader.initialOffset() == {"orders": {"0": 100, "1": 40}}
    assert reader.latestOffset() == {"orders": {"0": 110, "1": 40}}


def test_bare_calls_after_a_restart_continue_from_the_offsets_handed_to_partitions() -> None:
    reader = reader_for(FakeKafka({P0: 500, P1: 500}), maxOffsetsPerTrigger="10")
    checkpointed = {"orders": {"0": 300, "1": 200}}

    reader.partitions(checkpointed, checkpointed)  # what Spark 4.0/4.1 do on a restart

    assert reader.latestOffset() == {"orders": {"0": 304, "1": 206}}  # split by backlog


def test_bare_calls_hold_to_available_now_offsets_in_bounded_batches() -> None:
    kafka = FakeKafka({P0: 50, P1: 50})
    reader = reader_for(
        kafka,
        maxOffsetsPerTrigger="8",
        **{"retrylib.availableNowOffsets": json.dumps({"orders": {"0": 20, "1": 2}})},
    )

    assert bare_engine_batches(reader, {P0: 0, P1: 0}, triggers=6) == [8, 8, 6]
    assert reader.latestOffset() == {"orders": {"0": 20, "1": 2}}


def test_bare_calls_read_a_delay_tier_only_up_to_what_is_due() -> None:
    kafka = FakeKafka({P0: 40, P1: 40}, due={P0: 12, P1: 3})
    reader = reader_for(
        kafka,
        maxOffsetsPerTrigger="10",
        **{"retrylib.topicDelaysMs": json.dumps({"orders": 5000})},
    )

    assert bare_engine_batches(reader, {P0: 0, P1: 0}, triggers=4) == [10, 5]


def test_with_the_engines_start_the_reader_leaves_limits_and_target_to_the_engine() -> None:
    reader = reader_for(
        FakeKafka({P0: 50, P1: 50}),
        maxOffsetsPerTrigger="8",
        **{"retrylib.availableNowOffsets": json.dumps({"orders": {"0": 20, "1": 2}})},
    )

    end = reader.latestOffset({"orders": {"0": 10, "1": 10}}, None)

    assert end == {"orders": {"0": 50, "1": 50}}


def test_a_topic_no_longer_subscribed_keeps_its_offsets_for_when_it_comes_back() -> None:
    # The checkpoint's offsets hold a retry tier taken out of the config since.
    kafka = FakeKafka({P0: 50, P1: 50})
    tier = {"orders.job.retry.3s": {"0": 40}}
    reader = reader_for(kafka)

    assert reader.latestOffset({"orders": {"0": 10, "1": 10}, **tier}, None) == {
        "orders": {"0": 50, "1": 50},
        **tier,
    }
    reader.partitions(
        {"orders": {"0": 50, "1": 50}, **tier}, {"orders": {"0": 50, "1": 50}, **tier}
    )
    assert reader.latestOffset() == {"orders": {"0": 50, "1": 50}, **tier}  # Spark 4.0/4.1

    # Subscribed again: read on from offset 40, not from 0.
    kafka.latest[("orders.job.retry.3s", 0)] = 45
    again = reader_for(kafka, subscribe="orders,orders.job.retry.3s", maxOffsetsPerTrigger="1000")
    start = {"orders": {"0": 50, "1": 50}, **tier}
    end = again.latestOffset(start, None)
    assert end == {"orders": {"0": 50, "1": 50}, "orders.job.retry.3s": {"0": 45}}
    assert [(r.topic, r.start, r.end) for r in again.partitions(start, end)] == [
        ("orders.job.retry.3s", 40, 45)
    ]


def test_a_topic_matching_the_pattern_is_not_kept_when_it_is_gone() -> None:
    reader = reader_for(FakeKafka({P0: 5}), subscribePattern="ord.*")

    assert reader.latestOffset({"orders": {"0": 1}, "orderz": {"0": 7}}, None) == {
        "orders": {"0": 5}
    }


def test_a_topic_created_again_with_fewer_partitions_fails_naming_it_and_what_it_took() -> None:
    kafka = FakeKafka({P0: 50, P1: 50})
    reader = reader_for(kafka)
    assert reader.latestOffset({"orders": {"0": 10, "1": 20}}, None) == {
        "orders": {"0": 50, "1": 50}
    }

    kafka.latest = {P0: 3}  # deleted, created again with one partition, 3 records since

    with pytest.raises(TopicError) as raised:
        reader.latestOffset({"orders": {"0": 50, "1": 45}}, None)
    assert str(raised.value) == (
        "topic(s) deleted and created again since the job read them ('orders': partition 0 "
        "ends at offset 3, before the job's position 50, partition 1 is gone): the 5 "
        "record(s) that waited there unread are lost. To read them on from their start, set "
        "kafka.fail_on_data_loss = false for one run"
    )


def test_a_topic_created_again_behind_what_the_reader_saw_fails_though_nothing_was_read() -> None:
    kafka = FakeKafka({P0: 6})  # a tier of records not due yet: the job's position stays 0
    reader = reader_for(kafka)
    assert reader.latestOffset({"orders": {"0": 0}}, None) == {"orders": {"0": 6}}

    kafka.latest = {P0: 0}  # deleted and created again: no position is behind it

    expected = (
        "'orders': partition 0 ends at offset 0, before offset 6 it had): the 6 record(s) "
        "that waited there unread"
    )
    with pytest.raises(TopicError, match=re.escape(expected)):
        reader.latestOffset({"orders": {"0": 0}}, None)


def test_without_fail_on_data_loss_a_topic_created_again_is_read_from_its_start(caplog) -> None:
    reader = reader_for(FakeKafka({P0: 3}), failOnDataLoss="false")
    checkpointed = {"orders": {"0": 50, "1": 45}}  # a restart: nothing seen before

    end = reader.latestOffset(checkpointed, None)

    assert end == {"orders": {"0": 3}}
    assert [(r.partition, r.start, r.end) for r in reader.partitions(checkpointed, end)] == [
        (0, 0, 3)
    ]
    assert "the records that waited there unread are lost" in caplog.text
    assert "'orders': partition 0 ends at offset 3" in caplog.text


def test_records_a_topic_created_again_took_ride_on_the_next_batch_as_records_lost(
    caplog,
) -> None:
    kafka = FakeKafka({P0: 50, P1: 50})
    reader = reader_for(kafka, failOnDataLoss="false", **{"retrylib.emit": "ranges"})
    reader.latestOffset({"orders": {"0": 40, "1": 45}}, None)  # it sees 10 + 5 waiting

    kafka.latest = {P0: 3}  # deleted, created again with one partition, 3 records since
    start = {"orders": {"0": 40, "1": 45}}
    end = reader.latestOffset(start, None)

    [group] = reader.partitions(start, end)
    assert group.ranges == [("orders", 0, 0, 3, None), ("orders", 0, 3, 3, 15)]
    assert "the 15 record(s) that waited there unread are lost" in caplog.text
    assert reader.partitions(end, end) == []  # counted once


def test_records_a_deleted_topic_took_ride_on_an_empty_range_when_nothing_is_read(
    caplog, tmp_path
) -> None:
    tier = ("orders.retry", 0)
    kafka = FakeKafka({P0: 5, tier: 12})
    reader = reader_for(
        kafka,
        subscribe="orders,orders.retry",
        failOnDataLoss="false",
        **{
            "retrylib.emit": "ranges",
            "retrylib.keyOrder": json.dumps(
                {"tiers": {"orders": ["orders.retry"]}, "stateFile": str(tmp_path / "queues")}
            ),
        },
    )
    start = {"orders": {"0": 5}, "orders.retry": {"0": 4}}
    reader.latestOffset(start, None)

    del kafka.latest[tier]  # deleted, not created again yet
    end = reader.latestOffset(start, None)

    assert end == {"orders": {"0": 5}}
    assert [g.ranges for g in reader.partitions(start, end)] == [
        [("orders", 0, 5, 5, 8, None)]  # keyOrder's rows carry queues
    ]
    assert "topic(s) ['orders.retry'] deleted: the 8 record(s)" in caplog.text


@pytest.mark.parametrize(
    "bad",
    ['{"other": {"0": 1}}', '{"orders": {"0": -4}}', "not json"],
)
def test_available_now_offsets_option_is_checked(bad: str) -> None:
    with pytest.raises(ValueError, match="retrylib.availableNowOffsets"):
        parse_source_options(
            {
                "kafka.bootstrap.servers": "b:9092",
                "subscribe": "orders",
                "retrylib.availableNowOffsets": bad,
            }
        )


def test_arrow_schema_names_utc_where_pyspark_asks_for_a_time_zone(monkeypatch) -> None:
    calls = []

    def spark_42(schema, *, error_on_duplicated_field_names_in_struct=False, timezone=None):
        calls.append({"timezone": timezone})
        return pa.schema([])

    monkeypatch.setattr(arrow_records, "to_arrow_schema", spark_42)
    arrow_records.utc_arrow_schema(KAFKA_SCHEMA)

    assert calls == [{"timezone": "UTC"}]


def test_arrow_schema_passes_no_time_zone_where_pyspark_takes_none(monkeypatch) -> None:
    calls = []

    def spark_40(schema, error_on_duplicated_field_names_in_struct=False, timestamp_utc=True):
        calls.append({})
        return pa.schema([])

    monkeypatch.setattr(arrow_records, "to_arrow_schema", spark_40)
    arrow_records.utc_arrow_schema(KAFKA_SCHEMA)

    assert calls == [{}]


def test_the_installed_pyspark_gives_utc_microsecond_timestamps() -> None:
    timestamp = arrow_records.KAFKA_ARROW_SCHEMA.field("timestamp").type

    assert timestamp == pa.timestamp("us", tz="UTC")


@pytest.mark.parametrize("runner", [True, False])
def test_only_spark_s_source_runner_ends_quietly_when_the_jvm_hangs_up(runner, monkeypatch):
    """A query stopped while Spark's stream-source runner answers closes the runner's socket:
    its BrokenPipeError is the stop's, and prints no traceback into the job's log there."""
    import sys
    import types

    from retrylib.source.kafka_source import quiet_hang_up

    main = types.ModuleType("__main__")
    name = "pyspark.sql.streaming.python_streaming_source_runner" if runner else "retrylib"
    main.__spec__ = types.SimpleNamespace(name=name)
    monkeypatch.setitem(sys.modules, "__main__", main)
    printed = []
    monkeypatch.setattr(sys, "excepthook", lambda kind, value, trace: printed.append(kind))

    quiet_hang_up()
    for error in (BrokenPipeError, EOFError, ValueError):
        sys.excepthook(error, error(), None)

    assert printed == ([ValueError] if runner else [BrokenPipeError, EOFError, ValueError])


class _VanishingOnce(FakeKafka):
    """A FakeKafka whose next look at offsets by time finds the topic unknown to the broker
    (deleted while the reader looked), once."""

    vanish = False

    def list_offsets(self, partitions, timestamp: int) -> Offsets:
        if self.vanish and timestamp not in (LATEST, EARLIEST):
            self.vanish = False
            raise TopicVanished("listing offsets of ['orders'] failed")
        return super().list_offsets(partitions, timestamp)


def test_a_look_that_meets_a_topic_deleted_under_it_starts_over_and_counts_once() -> None:
    kafka = _VanishingOnce({P0: 6}, due={P0: 0})  # a tier of 6 records not due yet
    reader = reader_for(
        kafka,
        failOnDataLoss="false",
        **{"retrylib.emit": "ranges", "retrylib.topicDelaysMs": json.dumps({"orders": 5000})},
    )
    start = {"orders": {"0": 0}}
    reader.latestOffset(start, None)

    kafka.latest = {P0: 0}  # created again: the look counts 6 lost before the topic vanishes
    kafka.vanish = True
    end = reader.latestOffset(start, None)

    assert [g.ranges for g in reader.partitions(start, end)] == [[("orders", 0, 0, 0, 6)]]


def test_an_unknown_topic_in_an_offsets_answer_is_a_vanished_topic() -> None:
    class Unknown:
        def offsets_for_times(self, partitions, timeout):
            raise KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))

    metadata = _Metadata.__new__(_Metadata)
    metadata._consumer = Unknown()

    with pytest.raises(TopicVanished, match=re.escape("listing offsets of ['orders'] failed")):
        metadata.list_offsets([P0, P1], LATEST)
