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
import sys
import threading
import uuid
from collections import Counter
from pathlib import Path

from helpers import read_topic, run_retrylib

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
