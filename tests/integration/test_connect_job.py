"""The job as a Spark Connect client: `retrylib run` with `SPARK_REMOTE` naming a local Spark
Connect server (tests/connect_server.py), which runs the batches in a Python process of its
own. The client and the server share this machine's disk, as a Databricks job's Python and
its cluster share /Volumes.
"""

from __future__ import annotations

import time

import pytest
from helpers import produce, read_table, run_retrylib


@pytest.mark.every_spark
def test_a_job_routes_retries_and_dead_letters_through_spark_connect(
    connect_server, bootstrap_servers, make_topic, write_config
):
    topic = make_topic("connect", partitions=2)
    records = [(f"ok-{i}", "v") for i in range(20)] + [("flaky1-a", "v"), ("bad-b", "v")]
    produce(bootstrap_servers, topic, records)
    config = write_config([topic], name="connectjob", retry={"delays": ["1s"]})
    env = {"SPARK_REMOTE": connect_server}

    first = run_retrylib("run", config.source_path, "--available-now", env=env)
    time.sleep(1.5)  # the retry of flaky1-a is due a second after its first attempt
    second = run_retrylib("run", config.source_path, "--available-now", env=env)

    assert first.returncode == 0, first.stderr[-3000:]
    assert second.returncode == 0, second.stderr[-3000:]
    output = read_table(config.output.table).to_pylist()
    assert sorted((row["key"], row["attempt"]) for row in output) == sorted(
        [(f"ok-{i}", 0) for i in range(20)] + [("flaky1-a", 1)]
    )
    dead = read_table(config.dead_letter.table).to_pylist()
    assert [(row["key"], row["error_class"]) for row in dead] == [(b"bad-b", "builtins.ValueError")]
