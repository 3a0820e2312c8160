"""Virtual partitions through `retrylib run` as a user runs it: `handler.parallelism` lanes
per task call the handler for several records at once, each key's records one at a time in
offset order, and the output is what one lane would write."""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path

from chispa import assert_df_equality
from helpers import produce, run_job_available_now, write_job_toml

HANDLERS_DIR = Path(__file__).parent / "handlers"


def test_lanes_call_at_once_and_keep_each_keys_order(
    spark, bootstrap_servers, make_topic, tmp_path
):
    topic = make_topic("lanes", partitions=2)
    records = [(f"customer-{i % 12}", str(i)) for i in range(240)]
    produce(bootstrap_servers, topic, records, partitions=2)
    path = write_job_toml(
        tmp_path / "job.toml",
        topics=[topic],
        name="lanes",
        bootstrap_servers=bootstrap_servers,
        handler={
            "function": "lane_handlers:waiting",
            "output_schema": "key STRING, offset BIGINT",
            "paths": [HANDLERS_DIR],
            "timeout": "30s",
            "parallelism": 6,
        },
    )
    call_log = tmp_path / "calls.jsonl"

    done = run_job_available_now(path, env={"RETRYLIB_TEST_CALL_LOG": str(call_log)})

    assert done.returncode == 0, done.stderr[-3000:]
    calls = [json.loads(line) for line in call_log.read_text().splitlines()]
    assert len(calls) == len(records)
    by_key: dict[str, list[dict]] = {}
    for call in sorted(calls, key=lambda c: c["start"]):
        by_key.setdefault(call["key"], []).append(call)
    for key, in_order in by_key.items():
        offsets = [call["offset"] for call in in_order]
        assert offsets == sorted(offsets), key
        for before, after in pairwise(in_order):
            assert after["start"] >= before["end"], f"{key}: two calls at once"
    # Two tasks (local[2]) ran their records on six lanes each: more calls at once than tasks.
    edges = sorted([(c["start"], 1) for c in calls] + [(c["end"], -1) for c in calls])
    running = most = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    assert most > 2
    output = spark.read.format("delta").load(str(tmp_path / "out"))
    expected = spark.createDataFrame(
        [(call["key"], call["offset"]) for call in calls], output.schema
    )
    assert_df_equality(output, expected, ignore_row_order=True)
