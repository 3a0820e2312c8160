"""The job as a Spark Connect client: `retrylib run` with `SPARK_REMOTE` naming a local Spark
Connect server (tests/connect_server.py), which runs the batches in a Python process of its
own. The client and the server share this machine's disk, as a Databricks job's Python and
its cluster share /Volumes.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest
from connect_server import ConnectServer
from helpers import (
    job_env,
    produce,
    read_table,
    read_table_rows,
    retrylib_command,
    run_retrylib,
    running_job,
    wait_for,
    wait_for_rows,
)


@pytest.mark.every_spark
def test_a_job_routes_retries_and_dead_letters_through_spark_connect(
    connect_server, bootstrap_servers, make_topic, write_config, tmp_path
):
    """Two availableNow runs: the first routes the main topic, the second the retry then
    due; each batch's metrics row is written by the server's process."""
    topic = make_topic("connect", partitions=2)
    records = [(f"ok-{i}", "v") for i in range(20)] + [("flaky1-a", "v"), ("bad-b", "v")]
    produce(bootstrap_servers, topic, records)
    config = write_config(
        [topic],
        name="connectjob",
        retry={"delays": ["1s"]},
        metrics={"table": f"{tmp_path}/metrics"},
    )
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
    metrics = read_table(config.metrics.table).to_pylist()
    assert sum(row["records_main"] for row in metrics) == len(records)
    assert sum(row["records_retry"] for row in metrics) == 1
    # The client logs each batch the server finished (from the query's progress).
    logged = re.findall(
        r"batch (\d+) done on the Spark Connect server", first.stderr + second.stderr
    )
    assert sorted(map(int, logged)) == sorted(row["batch_id"] for row in metrics)


@pytest.mark.every_spark
def test_a_job_whose_client_or_server_is_killed_writes_each_record_once(
    bootstrap_servers, make_topic, write_config, tmp_path
):
    """SIGKILL the client mid-run: its query runs on in the server, and the client started
    again takes the job over (the lease, then Spark stops the earlier run of the query) and
    runs batches of its own. Then kill the server and that client mid-run: a new server and
    client finish the job. Every record is in the output once."""
    topic = make_topic("connectcrash", partitions=2)
    keys = [f"ok-{i}" for i in range(240)]
    produce(bootstrap_servers, topic, [(key, "v") for key in keys])
    config = write_config([topic], name="connectcrash", kafka={"max_offsets_per_trigger": 20})
    command = retrylib_command("run", config.source_path)

    server = ConnectServer(tmp_path).start()
    try:
        env = job_env({"SPARK_REMOTE": server.url})
        first_log = tmp_path / "client-1.log"
        with running_job(command, env, first_log) as client:
            wait_for_rows(client, first_log, config.output.table, lambda rows: rows > 0, 180)
            client.kill()
        second_log = tmp_path / "client-2.log"
        with running_job(command, env, second_log) as client:
            wait_for(
                lambda: "done on the Spark Connect server" in second_log.read_text(),
                180,
                "a batch done on the server",
                client,
            )
            before = read_table_rows(config.output.table)
            server.kill()  # the client would retry it for minutes (PySpark's retry policy)
            client.kill()
        server = ConnectServer(tmp_path).start()
        done = run_retrylib(
            "run", config.source_path, "--available-now", env={"SPARK_REMOTE": server.url}
        )
    finally:
        server.stop()

    assert done.returncode == 0, done.stderr[-3000:]
    assert 0 < before < len(keys)
    output = read_table(config.output.table).column("key").to_pylist()
    assert sorted(output) == sorted(keys)


def test_the_users_spark_settings_reach_a_spark_connect_session(connect_server):
    """`RETRYLIB_SPARK_CONF` through Spark Connect: the server brings its own jars, and each
    setting is set on the session the client builds, or named in a warning where the server
    keeps its own."""
    show = (
        "from retrylib.spark.session import build_spark_session\n"
        "spark = build_spark_session('extras')\n"
        "print(spark.conf.get('spark.sql.shuffle.partitions'))\n"
        "print(spark.conf.get('spark.hadoop.fs.s3a.path.style.access'))\n"
    )
    env = job_env(
        {
            "SPARK_REMOTE": connect_server,
            "RETRYLIB_SPARK_CONF": "spark.sql.shuffle.partitions=7 "
            "spark.hadoop.fs.s3a.path.style.access=true spark.executor.memory=3g",
        }
    )
    done = subprocess.run(
        [sys.executable, "-c", show], env=env, capture_output=True, text=True, timeout=300
    )

    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["7", "true"]
    refused = [line for line in done.stderr.splitlines() if "RETRYLIB_SPARK_CONF" in line]
    assert len(refused) == 1 and "spark.executor.memory" in refused[0], done.stderr[-3000:]
