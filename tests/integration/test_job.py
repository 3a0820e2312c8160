"""The job end to end: Kafka -> handler -> Delta, exactly once, across restarts and replays."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest
from chispa import assert_df_equality
from confluent_kafka.admin import ConfigResource
from helpers import produce, read_table, run_available_now, table_frame

from retrylib.config.topic_names import produced_topic
from retrylib.job import start_query
from retrylib.job.start import prepare_topics
from retrylib.kafka.clients import make_admin
from retrylib.state.checkpoint import Checkpoint


def expected_frame(spark, rows: list[tuple]):
    schema = "key STRING, value STRING, topic STRING, partition INT, offset BIGINT, attempt INT"
    return spark.createDataFrame(rows, schema)


@pytest.mark.every_spark
def test_thousands_of_records_land_once(spark, bootstrap_servers, make_topic, write_config):
    topic = make_topic("orders", partitions=4)
    records = [(f"ok-{i}", f"v{i}") for i in range(4000)]
    produce(bootstrap_servers, topic, records, partitions=4)
    config = write_config([topic])

    results = run_available_now(spark, config)

    actual = table_frame(spark, config.output.table).drop("partition", "offset")
    expected = expected_frame(spark, [(k, v, topic, 0, 0, 0) for k, v in records])
    assert_df_equality(actual, expected.drop("partition", "offset"), ignore_row_order=True)
    offsets = read_table(config.output.table).select(["partition", "offset"]).to_pylist()
    assert len({(o["partition"], o["offset"]) for o in offsets}) == 4000
    assert sum(r.counters.get("succeeded", 0) for r in results) == 4000


@pytest.mark.parametrize("scheme", [pytest.param("", marks=pytest.mark.every_spark), "file:"])
def test_restart_processes_only_new_records(
    spark, bootstrap_servers, make_topic, write_config, tmp_path, scheme
):
    """A plain checkpoint path, and a URI (retrylib's files then go through Hadoop's API)."""
    topic = make_topic("orders", partitions=3)
    produce(bootstrap_servers, topic, [(f"ok-a{i}", "first") for i in range(500)])
    config = write_config([topic], job={"checkpoint": f"{scheme}{tmp_path}/checkpoint"})
    run_available_now(spark, config)
    produce(bootstrap_servers, topic, [(f"ok-b{i}", "second") for i in range(300)])

    second = run_available_now(spark, config)

    assert sum(r.counters.get("records_main", 0) for r in second) == 300
    values = read_table(config.output.table).column("value").to_pylist()
    assert sorted(set(values)) == ["first", "second"]
    assert (values.count("first"), values.count("second")) == (500, 300)


def test_a_checkpoint_started_with_the_connector_stays_with_it(
    spark, bootstrap_servers, make_topic, write_config
):
    """ "auto" gives a new checkpoint retrylib's own reader; a checkpoint started with Spark's
    connector before the reader was recorded in it goes on with the connector, exactly once."""
    topic = make_topic("orders", partitions=2)
    produce(bootstrap_servers, topic, [(f"ok-a{i}", "first") for i in range(100)])
    connector = write_config([topic], kafka={"source": "builtin"})
    auto = write_config([topic])  # the same checkpoint and tables, kafka.source = "auto"
    run_available_now(spark, connector)
    reader = Path(Checkpoint(auto.job.checkpoint).state) / "main_reader.json"
    assert json.loads(reader.read_text()) == {"source": "builtin"}
    reader.unlink()  # as a checkpoint from before the record
    produce(bootstrap_servers, topic, [(f"ok-b{i}", "second") for i in range(50)])

    second = run_available_now(spark, auto)

    assert json.loads(reader.read_text()) == {"source": "builtin"}
    assert sum(r.counters.get("records_main", 0) for r in second) == 50
    values = read_table(auto.output.table).column("value").to_pylist()
    assert (values.count("first"), values.count("second")) == (100, 50)


@pytest.mark.every_spark
def test_replayed_batch_writes_nothing_twice(spark, bootstrap_servers, make_topic, write_config):
    from retrylib.kafka.arrow_records import KAFKA_SCHEMA

    topic = make_topic("orders", partitions=1)
    config = write_config([topic])
    now = datetime.now(UTC)
    rows = [(f"ok-{i}".encode(), b"v", topic, 0, i, now, 0, []) for i in range(50)]
    query, batch_commit = start_query(spark, config, available_now=True)
    query.awaitTermination()
    frame = batch_commit.routed(spark.createDataFrame(rows, KAFKA_SCHEMA))

    batch_commit(frame, 7)
    batch_commit(frame, 7)  # replay with the manifest in place: decisions reused
    from retrylib.state.files import delete_tree, join

    delete_tree(spark, join(config.job.checkpoint, "retrylib", "manifests"))
    batch_commit(frame, 7)  # replay from scratch: the Delta txn refuses a second commit
    batch_commit.close()

    table = read_table(config.output.table)
    assert table.num_rows == 50
    assert pa.compute.count_distinct(table.column("offset")).as_py() == 50


@pytest.mark.every_spark
def test_each_batch_commits_with_its_own_transaction(
    spark, bootstrap_servers, make_topic, write_config
):
    topic = make_topic("orders", partitions=2)
    produce(bootstrap_servers, topic, [(f"ok-{i}", "v") for i in range(300)], partitions=2)
    config = write_config([topic], kafka={"max_offsets_per_trigger": 100})

    results = run_available_now(spark, config)

    committed = [r.batch_id for r in results if r.output_committed]
    assert len(committed) >= 3  # 300 records at most 100 per batch
    txns = []
    for commit in sorted(Path(config.output.table, "_delta_log").glob("*.json")):
        actions = [json.loads(line) for line in commit.read_text().splitlines()]
        txns += [action["txn"] for action in actions if "txn" in action]
    assert [t["version"] for t in txns] == committed
    app_id = Checkpoint(config.job.checkpoint).app_id(spark, config.job.name)
    assert {t["appId"] for t in txns} == {app_id}


def test_catalog_table_names(spark, bootstrap_servers, make_topic, write_config):
    topic = make_topic("orders", partitions=2)
    records = [(f"ok-{i}", f"v{i}") for i in range(40)] + [("bad-1", "x")]
    produce(bootstrap_servers, topic, records)
    suffix = uuid.uuid4().hex[:8]
    output, dead = f"default.orders_{suffix}", f"spark_catalog.default.orders_dlq_{suffix}"
    config = write_config([topic], output={"table": output}, dead_letter={"table": dead})

    run_available_now(spark, config)

    actual = spark.table(output).drop("partition", "offset")
    expected = expected_frame(spark, [(k, v, topic, 0, 0, 0) for k, v in records[:-1]])
    assert_df_equality(actual, expected.drop("partition", "offset"), ignore_row_order=True)
    [dead_row] = spark.table(dead).select("key", "reason").collect()
    assert (dead_row.key, dead_row.reason) == (b"bad-1", "non_retryable")


def test_the_topics_the_job_creates_take_the_new_topics_settings(
    bootstrap_servers, make_topic, write_config
):
    """[kafka.new_topics]: partitions and configs for the tiers and the dead-letter topic (the
    tiers keep the job's own timestamp config); the control topic keeps one partition."""
    topic = make_topic("orders", partitions=1)
    config = write_config(
        [topic],
        name=f"made{uuid.uuid4().hex[:8]}",
        kafka={"new_topics": {"partitions": 2, "configs": {"retention.ms": "3600000"}}},
    )

    counts = prepare_topics(config)

    made = [*config.retry.tier_topics(), config.dead_letter.topic]
    assert counts == {**dict.fromkeys(made, 2), produced_topic(config.job.name): 1}
    admin = make_admin(bootstrap_servers, {})
    resources = [ConfigResource(ConfigResource.Type.TOPIC, name) for name in made]
    described = {
        resource.name: {name: entry.value for name, entry in future.result(30).items()}
        for resource, future in admin.describe_configs(resources).items()
    }
    assert {name: settings["retention.ms"] for name, settings in described.items()} == (
        dict.fromkeys(made, "3600000")
    )
    assert described[config.retry.tier_topics()[0]]["message.timestamp.after.max.ms"] == str(
        1_000 + 300_000
    )
