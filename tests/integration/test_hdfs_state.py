"""The job's state on a real HDFS, the file system EMR keeps it on (the `hdfs` fixture: one
per test run, so every HDFS test is in this module).

The checkpoint's files through the tests' session; then the crash harness
(tests/faults/harness.py) with the checkpoint and the tables on HDFS, `fs.defaultFS` set to
it, the job started through spark-submit.sh, its driver's local disk wiped before every
start, as a driver that comes back on another node finds it. The sweep takes one crash point
of each kind of write that differs by file system: a file replaced (the reader), a file
claimed (the identity, the signing key), a table's creation (the output's; the dead-letter
table's is the same), a batch's manifest, and the cleanup of a batch's state (the local
sweep in test_crash_recovery.py takes every point).
"""

from __future__ import annotations

import re
import signal
import sys
from pathlib import Path

import pytest
from helpers import (
    REPO,
    assert_one_error_line,
    job_env,
    produce,
    run_cli,
    running_job,
    wait_for_rows,
)

from retrylib.state.files import claim_json, list_names, read_json, replace_json

FAULTS_DIR = Path(__file__).resolve().parents[1] / "faults"
sys.path.insert(0, str(FAULTS_DIR))

from harness import FaultHarness, file_system_plan  # noqa: E402

SEED = 20261128


@pytest.mark.every_spark  # EMR runs Spark 4.0 with its Hadoop 3.4
def test_checkpoint_files_on_hdfs_are_renamed_into_place_never_created_under_their_name(
    spark, hdfs
):
    """HDFS shows a file from its create on: a crash while writing would leave it short."""
    folder = "/state-files/retrylib"
    identity, reader = f"{hdfs.uri}{folder}/identity.json", f"{hdfs.uri}{folder}/reader.json"
    assert read_json(spark, identity) is None
    assert claim_json(spark, identity, {"app_id": "first"}) == {"app_id": "first"}
    assert claim_json(spark, identity, {"app_id": "second"}) == {"app_id": "first"}
    replace_json(spark, reader, {"source": "python"})
    replace_json(spark, reader, {"source": "builtin"})
    assert read_json(spark, identity) == {"app_id": "first"}
    assert read_json(spark, reader) == {"source": "builtin"}
    assert sorted(list_names(spark, f"{hdfs.uri}{folder}")) == ["identity.json", "reader.json"]
    created = hdfs.created_files(folder)
    assert len(created) == 4 and all(".json.tmp-" in path for path in created), created


def _say(line: str) -> None:
    print(line, flush=True)


def test_exactly_once_on_hdfs_named_by_plain_paths_and_uris_across_a_crash_at_each_file_point(
    hdfs, tmp_path, spark
):
    """EMR's setup: `fs.defaultFS` is HDFS. The config names the state by plain paths in
    every other round and by `hdfs://` URIs in the rest (the same place): Spark resolves a
    plain path against HDFS, and so does retrylib for its own files. With the driver's disk
    wiped before each start nothing is lost (the signing key, the reader, the manifests are
    on HDFS), nothing is written at the plain path on the driver's disk, and every
    checkpoint file is written beside its name and renamed into place, never created under
    it (the name node's audit log says)."""
    state = str(tmp_path / "on-hdfs")
    with FaultHarness(
        tmp_path,
        SEED,
        entry="spark-submit",
        state=state,
        state_here=f"{hdfs.uri}{state}",
        other_state_name=f"{hdfs.uri}{state}",
        spark_conf={"spark.hadoop.fs.defaultFS": hdfs.uri},
        wipe_driver_disk=True,
        wave_size=40,
        say=_say,
    ) as harness:
        harness.sweep(file_system_plan(SEED), spark)
        logs = "".join(o.log.read_text(errors="replace") for o in harness.report.outcomes)
    assert not Path(state).exists()
    assert not re.search(r"input lag after batch \d+ unknown", logs)
    created = hdfs.created_files(f"{state}/checkpoint/retrylib/")
    assert any("signing_key.json.tmp-" in name for name in created), created
    assert not [name for name in created if name.endswith(".json")], created


def test_a_copy_naming_the_checkpoint_by_its_hdfs_uri_is_refused_while_one_runs_on_plain_paths(
    hdfs, tmp_path, bootstrap_servers, make_topic, write_config, capsys
):
    """EMR's two spellings of one folder: a job started through spark-submit.sh with plain
    paths (`fs.defaultFS` HDFS) holds the lease of its checkpoint's place, which Hadoop names;
    a copy naming that folder by its `hdfs://` URI is refused at start, in the lease's line,
    and the first goes on."""
    topic = make_topic("orders", partitions=2)
    produce(bootstrap_servers, topic, [(f"ok-{i}", "v") for i in range(2000)])
    state = str(tmp_path / "spelled")
    config = write_config(
        [topic],
        kafka={"max_offsets_per_trigger": 50},  # a long backlog
        job={"checkpoint": f"{state}/checkpoint"},
        output={"table": f"{state}/out"},
        dead_letter={"table": f"{state}/dlq"},
    )
    extra = f"--master local[2] --conf spark.hadoop.fs.defaultFS={hdfs.uri}"
    command = [str(REPO / "spark-submit.sh"), config.source_path]
    log_path = tmp_path / "job.log"
    with running_job(command, job_env({"RETRYLIB_SPARK_EXTRA": extra}), log_path) as job:
        table = f"{hdfs.uri}{state}/out"
        written = wait_for_rows(job, log_path, table, lambda rows: rows > 0, 240)
        copy = tmp_path / "by-uri.toml"
        copy.write_text(
            Path(config.source_path).read_text().replace(f'"{state}/', f'"{hdfs.uri}{state}/')
        )
        code, _, err = run_cli(capsys, "run", str(copy))
        assert_one_error_line(code, err, "job 'itest': another copy holds the lease")
        wait_for_rows(job, log_path, table, lambda rows: rows > written, 120)
        job.send_signal(signal.SIGTERM)
        job.wait(timeout=120)
    log = log_path.read_text()
    assert job.returncode == 0, log[-3000:]
    # The first copy's spelling told no place (a plain path): it took the lease of the place
    # Hadoop named before it touched the checkpoint.
    assert re.search(f"is at hdfs://[^/]+{state}/checkpoint: taking that place's lease", log), log
    assert not Path(state).exists()  # every file of both copies went to HDFS
