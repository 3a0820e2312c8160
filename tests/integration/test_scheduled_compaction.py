"""`[output] optimize_every`: the job compacts its Delta tables between batches, on the real
stack (Spark's Delta OPTIMIZE), and no row is lost or duplicated by it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from chispa import assert_df_equality
from delta.tables import DeltaTable
from helpers import produce, read_table

from retrylib.config.loader import load_config
from retrylib.job import start_query
from retrylib.state.checkpoint import Checkpoint
from retrylib.state.files import read_json, replace_json


def test_a_short_optimize_every_compacts_the_output_table(
    spark, bootstrap_servers, make_topic, write_config, tmp_path
):
    topic = make_topic("orders", partitions=2)
    records = [(f"ok-{i}", f"v{i}") for i in range(240)]
    produce(bootstrap_servers, topic, records, partitions=2)
    written = write_config([topic], kafka={"max_offsets_per_trigger": 60})
    config = load_config(written.source_path, overrides={"output.optimize_every": "1ms"})

    query, router = start_query(spark, config, available_now=True)
    try:
        query.awaitTermination()
    finally:
        router.close()
    assert query.exception() is None

    history = DeltaTable.forPath(spark, config.output.table).history()
    writes = [r.operationMetrics for r in history.where("operation = 'WRITE'").collect()]
    compactions = [r.operationMetrics for r in history.where("operation = 'OPTIMIZE'").collect()]
    assert len(writes) >= 4  # 240 records, at most 60 a batch
    # The first batch starts the clock; each later one is 1 ms past it and compacts.
    assert len(compactions) >= 3
    assert all(int(m["numRemovedFiles"]) > int(m["numAddedFiles"]) for m in compactions)
    files_now = DeltaTable.forPath(spark, config.output.table).detail().first()["numFiles"]
    assert files_now < sum(int(m["numFiles"]) for m in writes)
    assert files_now == 1  # the last batch compacted after its own append
    assert Path(Checkpoint(config.job.checkpoint).compaction).exists()

    actual = spark.createDataFrame(read_table(config.output.table).to_pandas())
    expected = spark.createDataFrame(
        [(key, value, topic, 0) for key, value in records],
        "key STRING, value STRING, topic STRING, attempt INT",
    )
    assert_df_equality(
        actual.drop("partition", "offset"), expected, ignore_row_order=True, ignore_nullable=True
    )


@pytest.mark.parametrize("scheme", ["", "file:"])
def test_the_compaction_clock_is_replaced_in_place(spark, tmp_path, scheme):
    """A plain path is written beside and renamed; a URI through Hadoop's FileSystem."""
    uri = Checkpoint(f"{scheme}{tmp_path}").compaction
    replace_json(spark, uri, {"last_ms": 1})
    replace_json(spark, uri, {"last_ms": 2})
    assert read_json(spark, uri) == {"last_ms": 2}
    left = [n for n in os.listdir(tmp_path / "retrylib") if not n.startswith(".")]
    assert left == ["compaction.json"]  # no temporary file left
