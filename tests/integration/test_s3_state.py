"""The job's state on an object store, as EMR and Databricks users keep it on S3: the `s3`
fixture (moto's server, one per test run, so every S3 test is in this module) reached through
Hadoop's S3A, the checkpoint and both tables on `s3a://`.

The checkpoint's claimed files through the tests' session; then the crash harness
(tests/faults/harness.py) with the state on S3, the job started through spark-submit.sh with
S3A's jars and settings given as a user gives them (`RETRYLIB_SPARK_JARS`,
`RETRYLIB_SPARK_CONF`), its driver's local disk wiped before every start, at the crash points
that differ by file system (`FILE_SYSTEM_POINTS`); then `retrylib redrive` of the dead
letters it left, as a process of its own given the same variables.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import uuid
from collections import Counter
from pathlib import Path

from helpers import (
    REPO,
    assert_one_error_line,
    job_env,
    produce,
    read_topic,
    run_cli,
    run_retrylib,
    running_job,
    wait_for_rows,
)

from retrylib.state.files import claim_json, read_json

FAULTS_DIR = Path(__file__).resolve().parents[1] / "faults"
sys.path.insert(0, str(FAULTS_DIR))

from harness import FaultHarness, file_system_plan  # noqa: E402

SEED = 20261207
RACES = 12


def test_a_claim_racing_another_on_s3_has_one_winner(spark, s3):
    """Two drivers claiming one file at once (an identity, a signing key): S3 shows an
    object whole on close, and a plain create-if-absent only looks before it writes, so both
    would write and each believe it won. S3A's conditional create (If-None-Match) refuses
    the second close: one winner, and the loser reads the winner's content."""

    def claim(uri: str, name: str, start: threading.Barrier, results: dict) -> None:
        start.wait()
        results[name] = claim_json(spark, uri, {"app_id": name})

    for race in range(RACES):
        uri = f"{s3.root}/claims/{uuid.uuid4().hex}/identity.json"
        start, results = threading.Barrier(2), {}
        threads = [
            threading.Thread(target=claim, args=(uri, name, start, results)) for name in "ab"
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        in_place = read_json(spark, uri)
        assert results["a"] == results["b"] == in_place, f"race {race}: {results}, {in_place}"


def test_exactly_once_on_s3_across_a_crash_at_each_file_point_then_a_redrive(spark, s3, tmp_path):
    """The state on `s3a://`, the driver's disk wiped before each start: every crash point
    that differs by file system finishes exactly once, and a redrive of the non-retryable
    dead letters sends each once and marks it, a second redrive nothing."""
    state = f"{s3.root}/sweep-{uuid.uuid4().hex[:8]}"
    with FaultHarness(
        tmp_path,
        SEED,
        entry="spark-submit",
        state=state,
        job_environment=s3.job_env(),
        wipe_driver_disk=True,
        wave_size=40,
        say=lambda line: print(line, flush=True),
    ) as harness:
        harness.sweep(file_system_plan(SEED), spark)
        bad = [r for r in harness.inputs if r.kind == "bad"]
        assert bad, "the waves hold no non-retryable record to redrive"
        command = ("redrive", str(harness.config_path), "--error-class", "ValueError", "--json")

        first = run_retrylib(*command, env=s3.job_env())
        again = run_retrylib(*command, env=s3.job_env())

        assert first.returncode == 0, first.stderr[-3000:]
        assert json.loads(first.stdout)["sent"] == len(bad)
        assert again.returncode == 0, again.stderr[-3000:]
        assert json.loads(again.stdout)["sent"] == 0
        keys = Counter(
            m.key().decode() for m in read_topic(harness.broker.bootstrap_servers, harness.topic)
        )
        assert {r.key: keys[r.key] for r in bad} == {r.key: 2 for r in bad}  # input, copy
        dead = harness.job._read_table("dead_letter").to_pylist()
        redriven = [d for d in dead if d["reason"] == "non_retryable"]
        assert len(redriven) == len(bad)
        assert all(d["redriven_at"] is not None for d in redriven), redriven[:3]


def test_a_redrive_on_s3_waits_for_the_job_to_stop_and_loses_no_commit(
    spark, s3, tmp_path, bootstrap_servers, make_topic, write_config, capsys
):
    """Open-source Delta on S3 keeps commits apart within one driver only: while the job
    runs (through spark-submit.sh) and appends dead letters, a redrive of its table is
    refused in one line naming the log store to set, `check --tables` says so, and a second
    copy naming the checkpoint `s3://` for `s3a://` or with a trailing `/` is refused; once the
    job is stopped the redrive runs. Every dead letter is in the table once, the table's log
    has every version, and each dead letter goes back once."""
    topic = make_topic("orders", partitions=2)
    records = [(f"bad-{i}" if i % 10 == 0 else f"ok-{i}", "v") for i in range(400)]
    produce(bootstrap_servers, topic, records)
    state = f"{s3.root}/redrive-{uuid.uuid4().hex[:8]}"
    config = write_config(
        [topic],
        kafka={"max_offsets_per_trigger": 50},  # a long backlog: many appends
        job={"checkpoint": f"{state}/checkpoint"},
        output={"table": f"{state}/out"},
        dead_letter={"table": f"{state}/dlq"},
    )
    env = job_env({**s3.job_env(), "RETRYLIB_SPARK_EXTRA": "--master local[2]"})
    log_path = tmp_path / "job.log"
    redrive = ("redrive", config.source_path, "--error-class", "ValueError", "--json")
    with running_job([str(REPO / "spark-submit.sh"), config.source_path], env, log_path) as job:
        wait_for_rows(job, log_path, config.dead_letter.table, lambda rows: rows > 0, 240)
        refused = run_retrylib(*redrive, env=s3.job_env())
        _, _, warnings = run_cli(capsys, "check", config.source_path, "--tables")
        # A second copy of the job naming the same checkpoint otherwise: one place, one lease.
        for spelling in (f"{state}/checkpoint/", f"{state}/checkpoint".replace("s3a:", "s3:")):
            copy = tmp_path / f"copy-{len(spelling)}.toml"
            copy.write_text(
                Path(config.source_path)
                .read_text()
                .replace(json.dumps(f"{state}/checkpoint"), json.dumps(spelling))
            )
            code, _, err = run_cli(capsys, "run", str(copy))
            assert_one_error_line(code, err, "job 'itest': another copy holds the lease")
        job.send_signal(signal.SIGTERM)
        job.wait(timeout=120)
    assert job.returncode == 0, log_path.read_text()[-3000:]
    assert_one_error_line(
        refused.returncode,
        refused.stderr,
        "job 'itest' is running and s3a://",
        "spark.delta.logStore.s3a.impl=io.delta.storage.S3DynamoDBLogStore",
        "stop the job, then redrive",
    )
    assert "dead_letter.table: redrive runs only while the job is stopped" in warnings, warnings

    sent = run_retrylib(*redrive, env=s3.job_env())
    assert sent.returncode == 0, sent.stderr[-3000:]
    dead = spark.read.format("delta").load(config.dead_letter.table)
    bad = {row.id for row in dead.select("id").collect()}
    assert 0 < len(bad) == dead.count() == json.loads(sent.stdout)["sent"]
    assert dead.where("redriven_at IS NULL").count() == 0
    history = spark.sql(f"DESCRIBE HISTORY delta.`{config.dead_letter.table}`").collect()
    versions = sorted(row.version for row in history)
    assert versions == list(range(len(versions))), versions  # no version lost or overwritten
    redriven = {row.key for row in dead.selectExpr("CAST(key AS STRING) AS key").collect()}
    keys = Counter(m.key().decode() for m in read_topic(bootstrap_servers, topic))
    assert {k for k, n in keys.items() if n != (2 if k in redriven else 1)} == set()
    assert all(key.startswith("bad-") for key in redriven), redriven
