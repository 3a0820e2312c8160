"""The retrylib_kafka stream source against a real broker and a real Spark session."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import NewPartitions
from helpers import produce as produce_pairs
from helpers import (
    read_table_rows,
    run_until,
    wait_for,
    write_job_toml,
)
from pyspark.sql.pandas.types import to_arrow_schema

from retrylib.config.loader import load_config
from retrylib.config.schema import parse_schema
from retrylib.errors import KafkaSourceError
from retrylib.kafka import worker_clients
from retrylib.kafka.arrow_records import KAFKA_ARROW_SCHEMA, KAFKA_SCHEMA, RANGE_SCHEMA
from retrylib.kafka.clients import make_admin, make_consumer
from retrylib.kafka.reading import READ_COMMITTED, watermarks
from retrylib.source import range_reader
from retrylib.source.kafka_source import (
    KafkaStreamReader,
    ReadAllAvailable,  # None before Spark 4.2: this module's tests run on the default leg only
    ReadMaxRows,
)
from retrylib.source.options import parse_source_options
from retrylib.source.range_reader import KafkaInputPartition, read_range
from retrylib.task.plan import TaskPlan
from retrylib.task.routing import run_task

RecordId = tuple[str, int, int]  # topic, partition, offset


@dataclass
class Collector:
    """A foreachBatch function that keeps every batch's rows, task count and wall time."""

    batches: list[tuple[int, list, int, float]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, df, batch_id: int) -> None:
        tasks = df.rdd.getNumPartitions()
        rows = df.collect()
        with self.lock:
            self.batches.append((batch_id, rows, tasks, time.time()))

    @property
    def rows(self) -> list:
        with self.lock:
            return [row for _, rows, _, _ in self.batches for row in rows]

    def ids(self) -> list[RecordId]:
        return [(r.topic, r.partition, r.offset) for r in self.rows]


def produce(
    bootstrap: str,
    topic: str,
    count: int,
    partitions: Iterable[int],
    timestamp_ms: int | None = None,
    tag: str = "",
) -> dict[RecordId, tuple]:
    """Produce `count` records round-robin over `partitions`.

    Returns record id -> (key, value, headers).
    """
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    produced: dict[RecordId, tuple] = {}
    parts = list(partitions)

    def delivered(headers: list) -> Callable:
        def callback(err, msg) -> None:
            assert err is None, err
            produced[(msg.topic(), msg.partition(), msg.offset())] = (
                msg.key(),
                msg.value(),
                headers,
            )

        return callback

    for i in range(count):
        key = None if i % 7 == 0 else f"{tag}k{i}".encode()
        headers = [("n", str(i).encode()), ("empty", None)] if i % 3 == 0 else []
        extra = {} if timestamp_ms is None else {"timestamp": timestamp_ms}
        producer.produce(
            topic,
            key=key,
            value=f"{tag}v{i}".encode() * 3,
            partition=parts[i % len(parts)],
            headers=headers or None,
            on_delivery=delivered(headers),
            **extra,
        )
    assert producer.flush(30) == 0
    return produced


def start_query(spark, options: dict, checkpoint: str, sink: Callable, **trigger):
    reader = spark.readStream.format("retrylib_kafka")
    for key, value in options.items():
        reader = reader.option(key, value)
    return (
        reader.load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", checkpoint)
        .trigger(**trigger)
        .start()
    )


def run_available_now(spark, options: dict, checkpoint: str, sink: Collector) -> None:
    query = start_query(spark, options, checkpoint, sink, availableNow=True)
    assert query.awaitTermination(180), "availableNow query did not finish"


def test_reads_every_record_once_with_kafka_schema(
    spark, bootstrap_servers, make_topic, tmp_path
) -> None:
    topics = [make_topic("src", partitions=3) for _ in range(3)]
    produced = {}
    for topic in topics:
        produced.update(produce(bootstrap_servers, topic, 700, range(3), tag=topic))
    options = {
        "kafka.bootstrap.servers": bootstrap_servers,
        "subscribe": ",".join(topics),
        "retrylib.maxRecordsPerTask": "100",
    }
    assert spark.readStream.format("retrylib_kafka").options(**options).load().schema == (
        KAFKA_SCHEMA
    )

    sink = Collector()
    run_available_now(spark, options, str(tmp_path / "cp"), sink)

    ids = sink.ids()
    assert len(ids) == len(set(ids)) == len(produced) == 2100
    assert set(ids) == set(produced)
    for row in sink.rows:
        key, value, headers = produced[(row.topic, row.partition, row.offset)]
        assert (row.key, row.value) == (key, value)
        assert [(h.key, h.value) for h in row.headers] == headers
        assert row.timestampType == 0 and row.timestamp is not None
    # 9 partitions of ~233 records, at most 100 per task: 3 tasks each
    assert sum(tasks for _, _, tasks, _ in sink.batches) == 27


def test_restart_from_checkpoint_reads_only_new_records(
    spark, bootstrap_servers, make_topic, tmp_path
) -> None:
    topic = make_topic("restart", partitions=2)
    options = {"kafka.bootstrap.servers": bootstrap_servers, "subscribe": topic}
    checkpoint = str(tmp_path / "cp")
    first = produce(bootstrap_servers, topic, 300, range(2), tag="a")
    sink = Collector()
    run_available_now(spark, options, checkpoint, sink)
    assert sorted(sink.ids()) == sorted(first)

    second = produce(bootstrap_servers, topic, 200, range(2), tag="b")
    sink = Collector()
    run_available_now(spark, options, checkpoint, sink)
    assert sorted(sink.ids()) == sorted(second)


def test_starting_offsets_latest_skips_existing_records(
    spark, bootstrap_servers, make_topic, tmp_path
) -> None:
    topic = make_topic("latest", partitions=2)
    produce(bootstrap_servers, topic, 100, range(2))
    options = {
        "kafka.bootstrap.servers": bootstrap_servers,
        "subscribe": topic,
        "startingOffsets": "latest",
    }
    checkpoint = str(tmp_path / "cp")
    sink = Collector()
    run_available_now(spark, options, checkpoint, sink)
    assert sink.ids() == []

    later = produce(bootstrap_servers, topic, 50, range(2))
    run_available_now(spark, options, checkpoint, sink)
    assert sorted(sink.ids()) == sorted(later)


def test_starting_offsets_per_partition_json(
    spark, bootstrap_servers, make_topic, tmp_path
) -> None:
    topic = make_topic("json", partitions=3)
    produce(bootstrap_servers, topic, 90, range(3))  # offsets 0..29 in each partition
    options = {
        "kafka.bootstrap.servers": bootstrap_servers,
        "subscribe": topic,
        "startingOffsets": json.dumps({topic: {"0": 25, "1": -1}}),
    }
    sink = Collector()
    run_available_now(spark, options, str(tmp_path / "cp"), sink)
    expected = [(topic, 0, o) for o in range(25, 30)] + [(topic, 2, o) for o in range(30)]
    assert sorted(sink.ids()) == expected


def test_max_offsets_per_trigger_splits_into_batches(
    spark, bootstrap_servers, make_topic, tmp_path
) -> None:
    topic = make_topic("limit", partitions=3)
    produced = produce(bootstrap_servers, topic, 300, [0, 0, 1, 2])  # backlog 150, 75, 75
    options = {
        "kafka.bootstrap.servers": bootstrap_servers,
        "subscribe": topic,
        "maxOffsetsPerTrigger": "100",
    }
    sink = Collector()
    run_available_now(spark, options, str(tmp_path / "cp"), sink)
    sizes = [len(rows) for _, rows, _, _ in sink.batches if rows]
    assert sizes == [100, 100, 100]
    first_batch = sink.batches[0][1]
    per_partition = sorted(sum(1 for r in first_batch if r.partition == p) for p in range(3))
    assert per_partition == [25, 25, 50]
    assert sorted(sink.ids()) == sorted(produced)


def test_new_partitions_are_picked_up_while_running(
    spark, bootstrap_servers, make_topic, tmp_path
) -> None:
    topic = make_topic("grow", partitions=2)
    options = {"kafka.bootstrap.servers": bootstrap_servers, "subscribe": topic}
    sink = Collector()
    query = start_query(spark, options, str(tmp_path / "cp"), sink, processingTime="0.5 seconds")
    try:
        before = produce(bootstrap_servers, topic, 40, range(2))
        wait_for(lambda: len(sink.ids()) == 40, 60, "records of the first two partitions")
        admin = make_admin(bootstrap_servers, {})
        for future in admin.create_partitions([NewPartitions(topic, 4)]).values():
            future.result(30)
        after = produce(bootstrap_servers, topic, 40, range(4), tag="new")
        wait_for(lambda: len(sink.ids()) == 80, 60, "records of the new partitions")
    finally:
        query.stop()
    assert sorted(sink.ids()) == sorted({**before, **after})
    assert {p for _, p, _ in sink.ids()} == {0, 1, 2, 3}


def test_delay_frontier_releases_records_once_due(
    spark, bootstrap_servers, make_topic, tmp_path
) -> None:
    """One source for a main topic (read from latest) and a delay tier (read from earliest,
    each record once due)."""
    delay_ms = 1_000
    main, tier = make_topic("main", partitions=1), make_topic("tier", partitions=2)
    now_ms = int(time.time() * 1000)
    produce(bootstrap_servers, main, 5, [0], tag="old")  # before the start: skipped
    due = produce(bootstrap_servers, tier, 20, range(2), timestamp_ms=now_ms - 60_000)
    not_before_ms = now_ms + 2_500
    later = produce(
        bootstrap_servers, tier, 20, range(2), timestamp_ms=not_before_ms - delay_ms, tag="l"
    )
    options = {
        "kafka.bootstrap.servers": bootstrap_servers,
        "subscribe": f"{main},{tier}",
        "startingOffsets": "latest",
        "retrylib.topicDelaysMs": json.dumps({tier: delay_ms}),
    }
    sink = Collector()
    query = start_query(spark, options, str(tmp_path / "cp"), sink, processingTime="0.5 seconds")
    try:
        wait_for(lambda: len(sink.ids()) == 40, 60, "the delayed records")
        fresh = produce(bootstrap_servers, main, 5, [0], tag="new")
        wait_for(lambda: len(sink.ids()) == 45, 60, "the main topic's new records")
    finally:
        query.stop()
    arrivals = {}
    for _, rows, _, at in sink.batches:
        arrivals.update({(r.topic, r.partition, r.offset): at for r in rows})
    assert set(arrivals) == set(due) | set(later) | set(fresh)
    assert all(arrivals[record] >= not_before_ms / 1000 for record in later), "read early"
    # The first batch holds every record due at the start; the later ones too when it was
    # planned after they became due (Spark starting slower than 2.5 s, as on a loaded
    # machine), which the arrival check above allows.
    first_batch = {(r.topic, r.partition, r.offset) for r in sink.batches[0][1]}
    assert set(due) <= first_batch <= set(due) | set(later)


def test_missing_topic_fails_naming_it(spark, bootstrap_servers, make_topic, tmp_path) -> None:
    topic = make_topic("present", partitions=1)
    options = {
        "kafka.bootstrap.servers": bootstrap_servers,
        "subscribe": f"{topic},no-such-topic-xyz",
    }
    query = start_query(spark, options, str(tmp_path / "cp"), Collector(), availableNow=True)
    with pytest.raises(Exception, match="no-such-topic-xyz"):
        query.awaitTermination(120)


def test_unknown_option_fails_at_load(spark, bootstrap_servers) -> None:
    reader = (
        spark.readStream.format("retrylib_kafka")
        .option("kafka.bootstrap.servers", bootstrap_servers)
        .option("subscribe", "t")
        .option("assign", '{"t": [0]}')
    )
    with pytest.raises(Exception, match="unknown option 'assign'"):
        reader.load()


# --- the reader without Spark: the calls the engine makes, and reads of single ranges -------


def make_reader(bootstrap: str, topic: str, **options: str) -> KafkaStreamReader:
    return KafkaStreamReader(
        parse_source_options({"kafka.bootstrap.servers": bootstrap, "subscribe": topic, **options})
    )


def test_available_now_target_excludes_later_records(bootstrap_servers, make_topic) -> None:
    topic = make_topic("target", partitions=2)
    produce(bootstrap_servers, topic, 20, range(2))
    reader = make_reader(bootstrap_servers, topic, maxOffsetsPerTrigger="6")
    try:
        start = reader.initialOffset()
        assert start == {topic: {"0": 0, "1": 0}}
        assert reader.getDefaultReadLimit() == ReadMaxRows(6)
        reader.prepareForTriggerAvailableNow()
        produce(bootstrap_servers, topic, 20, range(2))
        assert reader.latestOffset(start, ReadMaxRows(6)) == {topic: {"0": 3, "1": 3}}
        target = reader.latestOffset(start, ReadAllAvailable())
        assert target == {topic: {"0": 10, "1": 10}}
        assert reader.latestOffset(target, ReadAllAvailable()) == target
        assert reader.reportLatestOffset() == {topic: {"0": 20, "1": 20}}
    finally:
        reader.stop()


def test_a_delay_tier_is_read_past_the_commit_marker_of_due_records(
    bootstrap_servers, make_topic
) -> None:
    """A transaction's commit marker has the time of the commit, later than its records':
    once they are due, the frontier takes the marker with them, so that it does not make a
    batch of its own a moment later. A not-yet-due tail with records holds the frontier."""
    delay_ms = 60_000
    topic = make_topic("marker", partitions=1)
    producer = Producer({"bootstrap.servers": bootstrap_servers, "transactional.id": topic})
    producer.init_transactions(30)
    committed = make_consumer(bootstrap_servers, READ_COMMITTED)

    def transaction(timestamp_ms: int, records: int) -> None:
        [(_, stable)] = watermarks(committed, [(topic, 0)]).values()
        producer.begin_transaction()
        for _ in range(records):
            producer.produce(topic, value=b"r", partition=0, timestamp=timestamp_ms)
        producer.commit_transaction(30)
        # The commit returns once the coordinator has decided; the marker, and with it the
        # partition's last stable offset, follows a moment later.
        wait_for(
            lambda: watermarks(committed, [(topic, 0)])[(topic, 0)][1] == stable + records + 1,
            10,
            "the transaction's commit marker",
        )

    now_ms = int(time.time() * 1000)
    transaction(now_ms - delay_ms - 5_000, 3)  # offsets 0-2, due; the marker at 3 is not
    reader = make_reader(
        bootstrap_servers,
        topic,
        **{
            **{f"kafka.{key}": value for key, value in READ_COMMITTED.items()},
            "retrylib.topicDelaysMs": json.dumps({topic: delay_ms}),
        },
    )
    try:
        first = reader.latestOffset({topic: {"0": 0}}, ReadAllAvailable())
        assert first == {topic: {"0": 4}}
        transaction(now_ms, 2)  # offsets 4-5 and the marker at 6: none due
        assert reader.latestOffset(first, ReadAllAvailable()) == first
        assert reader.latestOffset(first, ReadAllAvailable()) == first  # known: not read again
    finally:
        reader.stop()
        committed.close()


def test_latest_offset_without_arguments_as_on_spark_4_0(bootstrap_servers, make_topic) -> None:
    topic = make_topic("legacy", partitions=1)
    produce(bootstrap_servers, topic, 5, [0])
    reader = make_reader(bootstrap_servers, topic, maxOffsetsPerTrigger="2")
    try:
        assert reader.initialOffset() == {topic: {"0": 0}}
        assert reader.latestOffset() == {topic: {"0": 2}}
        assert reader.latestOffset() == {topic: {"0": 4}}
        produce(bootstrap_servers, topic, 5, [0])
        assert reader.latestOffset() == {topic: {"0": 6}}
    finally:
        reader.stop()


def test_read_range_yields_bounded_arrow_batches(
    bootstrap_servers, make_topic, monkeypatch
) -> None:
    monkeypatch.setattr(range_reader, "BATCH_ROWS", 7)
    topic = make_topic("arrow", partitions=1)
    produced = produce(bootstrap_servers, topic, 30, [0])
    part = KafkaInputPartition(topic, 0, 4, 25, bootstrap_servers, {})
    batches = list(read_range(part))
    assert [b.num_rows for b in batches] == [7, 7, 7]
    assert all(b.schema.equals(KAFKA_ARROW_SCHEMA) for b in batches)
    rows = [row for b in batches for row in b.to_pylist()]
    assert [r["offset"] for r in rows] == list(range(4, 25))
    for row in rows:
        key, value, headers = produced[(topic, 0, row["offset"])]
        assert (row["key"], row["value"]) == (key, value)
        assert [(h["key"], h["value"]) for h in row["headers"]] == headers


def test_read_range_skips_offset_gaps_of_transaction_markers(bootstrap_servers, make_topic) -> None:
    topic = make_topic("txn", partitions=1)
    producer = Producer({"bootstrap.servers": bootstrap_servers, "transactional.id": topic})
    producer.init_transactions(30)
    for batch in range(3):
        producer.begin_transaction()
        for i in range(4):
            producer.produce(topic, value=f"{batch}-{i}".encode(), partition=0)
        producer.commit_transaction(30)
    consumer = make_consumer(bootstrap_servers, {})
    [(_, high)] = watermarks(consumer, [(topic, 0)]).values()
    consumer.close()

    def read(end: int) -> list[bytes]:
        part = KafkaInputPartition(topic, 0, 0, end, bootstrap_servers, {})
        return [row["value"] for batch in read_range(part) for row in batch.to_pylist()]

    started = time.monotonic()
    # the whole partition: the last offset is a commit marker, the read ends at the high mark
    assert read(high) == [f"{b}-{i}".encode() for b in range(3) for i in range(4)]
    # a range ending on the first marker: ends at the first record past it
    assert read(5) == [f"0-{i}".encode() for i in range(4)]
    assert time.monotonic() - started < 10


def test_one_kept_consumer_reads_range_after_range_as_a_new_one_would(
    bootstrap_servers, make_topic, monkeypatch
) -> None:
    """The worker's consumer, assigned each range in turn: a range read again (a batch run
    again) ends at its commit marker as the first read did, a range of another partition gets
    nothing the last read fetched ahead, and a partition read before is read from where the
    next range starts, not from where the last read stopped."""
    monkeypatch.setattr(range_reader, "STALL_TIMEOUT_S", 10.0)  # a missing EOF fails soon
    topic = make_topic("kept", partitions=2)
    producer = Producer({"bootstrap.servers": bootstrap_servers, "transactional.id": topic})
    producer.init_transactions(30)
    for batch in range(3):  # per partition: 4 records and a commit marker, three times
        producer.begin_transaction()
        for i in range(4):
            for partition in (0, 1):
                producer.produce(
                    topic, value=f"p{partition}-{batch}-{i}".encode(), partition=partition
                )
        producer.commit_transaction(30)

    def read(partition: int, start: int, end: int) -> list[tuple[int, int, bytes]]:
        part = KafkaInputPartition(topic, partition, start, end, bootstrap_servers, {})
        return [
            (m.partition(), m.offset(), m.value())
            for chunk in range_reader.read_messages(part)
            for m in chunk
        ]

    def records(partition: int, offsets: Iterable[int]) -> list[tuple[int, int, bytes]]:
        return [
            (partition, o, f"p{partition}-{o // 5}-{o % 5}".encode()) for o in offsets if o % 5 < 4
        ]

    worker_clients.close_all()
    opened = worker_clients.opened()
    assert read(0, 0, 15) == records(0, range(15))  # ends at the partition's end (EOF)
    assert read(0, 0, 15) == records(0, range(15))  # EOF again for the same end
    assert read(1, 5, 9) == records(1, range(5, 9))
    assert read(0, 0, 2) == records(0, range(2))  # fetched ahead, up to the end
    assert read(0, 6, 13) == records(0, range(6, 13))
    assert read(1, 0, 15) == records(1, range(15))
    assert worker_clients.opened() - opened == 1


def test_read_range_fails_clearly_when_records_never_arrive(
    bootstrap_servers, make_topic, monkeypatch
) -> None:
    monkeypatch.setattr(range_reader, "STALL_TIMEOUT_S", 1.0)
    topic = make_topic("stall", partitions=1)
    produce(bootstrap_servers, topic, 3, [0])
    part = KafkaInputPartition(topic, 0, 0, 10, bootstrap_servers, {})
    with pytest.raises(KafkaSourceError, match=rf"{topic}\[0\] offsets 0..10.*at offset 3"):
        list(read_range(part))


def test_read_range_ends_at_aborted_transactions_and_counts_the_gap(
    bootstrap_servers, make_topic, caplog
) -> None:
    """Offsets of aborted transactions and markers hold no record under read_committed: the
    read ends at the partition's last stable offset, at once, and logs what it skipped."""
    topic = make_topic("aborted", partitions=1)
    producer = Producer({"bootstrap.servers": bootstrap_servers, "transactional.id": topic})
    producer.init_transactions(30)
    for batch, commit in ((0, True), (1, False), (2, False)):
        producer.begin_transaction()
        for i in range(4):
            producer.produce(topic, value=f"{batch}-{i}".encode(), partition=0)
        assert producer.flush(30) == 0  # an abort drops records still queued in the client
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
    committed = dict(READ_COMMITTED)

    def read(start: int) -> list[bytes]:
        part = KafkaInputPartition(topic, 0, start, 15, bootstrap_servers, committed)
        return [row["value"] for batch in read_range(part) for row in batch.to_pylist()]

    caplog.set_level("DEBUG", logger=range_reader.__name__)
    started = time.monotonic()
    # offsets 0-3 committed, 4 its marker, 5-8 and 10-13 aborted, 9 and 14 their markers
    assert read(0) == [f"0-{i}".encode() for i in range(4)]
    assert read(5) == []
    assert time.monotonic() - started < 10  # no waiting for records that will never come
    counts = [r.getMessage() for r in caplog.records if "without a record" in r.getMessage()]
    assert counts == [
        f"{topic}[0] offsets 0..15: 4 record(s), 11 offset(s) without a record for this "
        "reader (transaction markers, aborted transactions, compaction)",
        f"{topic}[0] offsets 5..15: 0 record(s), 10 offset(s) without a record for this "
        "reader (transaction markers, aborted transactions, compaction)",
    ]


def test_read_range_fails_when_records_of_the_range_were_deleted(
    bootstrap_servers, make_topic
) -> None:
    """Records deleted before the read (retention, delete-records) leave the range's offsets
    out of the broker's log: the read fails naming them instead of ending early at the
    partition's end with the records after the deletion, or none."""
    topic = make_topic("deleted", partitions=1)
    produce(bootstrap_servers, topic, 20, [0])
    admin = make_admin(bootstrap_servers, {})
    for future in admin.delete_records([TopicPartition(topic, 0, 12)]).values():
        future.result(30)

    with pytest.raises(
        KafkaSourceError,
        match=rf"{topic}\[0\]@0..11 were deleted from Kafka before they were read .*offset 12",
    ):
        list(read_range(KafkaInputPartition(topic, 0, 0, 20, bootstrap_servers, {})))
    with pytest.raises(KafkaSourceError, match=rf"{topic}\[0\]@3..7 were deleted"):
        list(read_range(KafkaInputPartition(topic, 0, 3, 8, bootstrap_servers, {})))
    kept = read_range(KafkaInputPartition(topic, 0, 12, 20, bootstrap_servers, {}))
    assert [row["offset"] for batch in kept for row in batch.to_pylist()] == list(range(12, 20))


def test_read_range_skips_deleted_records_with_a_warning_when_asked(
    bootstrap_servers, make_topic, caplog
) -> None:
    """failOnDataLoss false: the read goes on from the log's new start, names the records
    lost in a warning and reports how many."""
    topic = make_topic("lost", partitions=1)
    produce(bootstrap_servers, topic, 20, [0])
    admin = make_admin(bootstrap_servers, {})
    for future in admin.delete_records([TopicPartition(topic, 0, 12)]).values():
        future.result(30)
    lost: list[int] = []

    def read(start: int, end: int) -> list[int]:
        part = KafkaInputPartition(topic, 0, start, end, bootstrap_servers, {}, (), False)
        return [
            row["offset"] for batch in read_range(part, lost.append) for row in batch.to_pylist()
        ]

    with caplog.at_level("WARNING", logger=range_reader.__name__):
        assert read(0, 20) == list(range(12, 20))
        assert read(3, 8) == []
        assert read(12, 20) == list(range(12, 20))
    assert lost == [12, 5]
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 2
    assert f"records {topic}[0]@0..11 were deleted from Kafka" in warnings[0]
    assert f"records {topic}[0]@3..7 were deleted from Kafka" in warnings[1]


def test_a_deleted_topic_fails_the_query_or_is_left_out_with_a_warning(
    spark, bootstrap_servers, make_topic, tmp_path, caplog
) -> None:
    """A subscribed topic that is gone: the query fails naming it, as Spark's source does,
    or, with failOnDataLoss false, reads the others."""
    present = make_topic("present", partitions=2)
    produced = produce(bootstrap_servers, present, 10, [0, 1])
    options = {
        "kafka.bootstrap.servers": bootstrap_servers,
        "subscribe": f"{present},gone-topic-xyz",
        "failOnDataLoss": "false",
    }
    sink = Collector()
    with caplog.at_level("WARNING"):
        reader = KafkaStreamReader(parse_source_options(options))
        try:
            reader.initialOffset()
        finally:
            reader.stop()
        run_available_now(spark, options, str(tmp_path / "cp"), sink)
    assert sorted(sink.ids()) == sorted(produced)
    assert any("['gone-topic-xyz'] do not exist" in r.getMessage() for r in caplog.records)

    reader = KafkaStreamReader(parse_source_options({**options, "failOnDataLoss": "true"}))
    with pytest.raises(Exception, match="gone-topic-xyz.*kafka.fail_on_data_loss = false"):
        reader.initialOffset()
    reader.stop()


def test_ranges_read_in_the_task_give_the_handler_what_records_mode_gives(
    bootstrap_servers, make_topic, tmp_path
) -> None:
    """`retrylib.emit = ranges` rows, read and routed by `run_task`, reach the handler as the
    same records (keys, values, headers, timestamps) as the records-mode source emits."""
    topic = make_topic("ranges", partitions=2)
    # A recent time: a record older than the topic's retention (7 days by default) is deleted
    # at the broker's next retention check, possibly between producing and reading it.
    produce(bootstrap_servers, topic, 40, range(2), timestamp_ms=int(time.time() * 1000) - 60_000)
    options = {"retrylib.emit": "ranges", "retrylib.maxRecordsPerTask": "8"}
    reader = make_reader(bootstrap_servers, topic, **options, **{"retrylib.rangeGroups": "2"})
    try:
        start, end = reader.initialOffset(), reader.latestOffset(None)
        groups = reader.partitions(start, end)
        range_rows = [row for group in groups for row in reader.read(group)]
    finally:
        reader.stop()
    assert len(groups) == 2  # six ranges of at most 8 offsets, dealt into two tasks
    assert sorted(range_rows) == [
        (topic, p, first, min(first + 8, 20), None) for p in (0, 1) for first in (0, 8, 16)
    ]
    parts = [KafkaInputPartition(*row[:4], bootstrap_servers, {}) for row in range_rows]

    output_schema = parse_schema(
        "key BINARY, value BINARY, partition INT, offset BIGINT, timestamp BIGINT, headers STRING"
    ).to_arrow()
    plan = TaskPlan(
        job="ranges",
        batch_id=0,
        now_ms=int(time.time() * 1000),
        handler="job_handlers:echo",
        handler_paths=(str(Path(__file__).parent / "handlers"),),
        handler_timeout_ms=None,
        output_schema=output_schema,
        dead_letter_topic="unused.dlt",
        retry_topics={topic: (f"{topic}.retry",)},
        tier_delays_ms=(1000,),
        partition_counts={f"{topic}.retry": 2, "unused.dlt": 2},
        max_attempts=2,
        jitter=0.0,
        non_retryable=(),
        max_retry_after_ms=3_600_000,
        signing_key=b"k" * 32,
        bootstrap_servers=bootstrap_servers,
    )
    ranges = pa.RecordBatch.from_pylist(
        [dict(zip(RANGE_SCHEMA.names, row, strict=True)) for row in range_rows],
        schema=to_arrow_schema(RANGE_SCHEMA),
    )
    results = pa.Table.from_batches(list(run_task(plan, iter([ranges])))).to_pylist()
    [counters] = [json.loads(row["counters"]) for row in results if row["kind"] == "counters"]
    assert counters["succeeded"] == 40
    handled = [row["output"] for row in results if row["kind"] == "output"]

    expected = [
        {
            "key": row["key"],
            "value": row["value"],
            "partition": row["partition"],
            "offset": row["offset"],
            "timestamp": row["timestamp"].timestamp() * 1000 // 1,
            "headers": repr([(h["key"], h["value"]) for h in row["headers"]]),
        }
        for part in parts
        for batch in read_range(part)
        for row in batch.to_pylist()
    ]
    key = itemgetter("partition", "offset")
    assert sorted(handled, key=key) == sorted(expected, key=key)


def test_python_workers_keep_their_kafka_clients_across_tasks_and_batches(
    spark, bootstrap_servers, make_topic, tmp_path
) -> None:
    """`kafka.source = "python"` over 24 partitions in batches of 40 offsets: each batch's
    tasks read dozens of ranges of the main topic or its tier (24 partitions too), yet after
    the first batch the job's Python workers open no more than a few Kafka clients per
    batch, whatever the partition count (they keep them), and every record is handled once.
    """
    partitions = 24
    topic = make_topic("clients", partitions=partitions)
    path = write_job_toml(
        tmp_path / "job.toml",
        topics=[topic],
        name="clients",
        bootstrap_servers=bootstrap_servers,
        kafka={"source": "python", "max_offsets_per_trigger": 40},
        handler={
            "function": "job_handlers:by_key",
            "output_schema": "key STRING, value STRING, topic STRING, partition INT, "
            "offset BIGINT, attempt INT",
            "paths": [Path(__file__).parent / "handlers"],
        },
        retry={"delays": ["1s"], "max_attempts": 2},
    )
    # Every 8th record fails once: its retry is read back from the tier in a later batch.
    records = [(f"{'flaky1' if i % 8 == 0 else 'ok'}-{i}", "v") for i in range(5 * partitions)]
    produce_pairs(bootstrap_servers, topic, records, partitions=partitions)
    config = load_config(path)

    results = run_until(
        spark, config, lambda: read_table_rows(config.output.table) >= len(records), timeout=300
    )

    batches = [result.counters for result in results]
    opened = [batch.get("kafka_clients_opened", 0) for batch in batches]
    print(f"Kafka clients opened per batch: {opened}")
    assert sum(batch.get("records_main", 0) for batch in batches) == len(records)
    assert sum(batch.get("records_retry", 0) for batch in batches) == len(records) // 8
    assert len(batches) >= 4, opened
    # A worker opens a consumer for the main topic and one for the tier (read_committed)
    # the first time it reads each; a produce task opens its unit's producer when the unit
    # comes to another worker than last time, and the two consumers that look for markers
    # the first time; a batch may hand a task to a worker that has not yet.
    concurrent_tasks = 2  # local[2]
    assert max(opened[1:]) <= (2 + 3) * concurrent_tasks, opened
    output = spark.read.format("delta").load(str(tmp_path / "out"))
    keys = [row.key for row in output.select("key").collect()]
    assert sorted(keys) == sorted(key for key, _ in records)
