"""Table upkeep beside a running job: OPTIMIZE and VACUUM from another Spark session, as
Databricks' predictive optimization runs them, with a redrive at the same time. The job reads
its tables in threads of its own between batches, and a table state lost to a concurrent
OPTIMIZE is computed again in the reading thread (issue 43, item 5: the job died once with
DELTA_SPARK_SESSION_NOT_SET)."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

from delta.tables import DeltaTable
from helpers import (
    job_env,
    produce,
    read_table,
    read_table_rows,
    retrylib_command,
    run_cli,
    running_job,
    wait_for,
)

KEYS = 6  # of each kind: handled at once, and failing until the dependency is back


def test_optimize_and_vacuum_beside_the_job_and_a_redrive_keep_every_record_once(
    spark, bootstrap_servers, make_topic, write_config, tmp_path, capsys
):
    topic = make_topic("upkeep", partitions=2)
    keys = [f"{kind}-{i}" for i in range(KEYS) for kind in ("ok", "dep")]
    produce(bootstrap_servers, topic, [(key, "v") for key in keys], partitions=2)
    config = write_config(
        [topic], kafka={"max_offsets_per_trigger": 6}, retry={"delays": ["1s"], "max_attempts": 2}
    )
    tables = {"output": config.output.table, "dead letter": config.dead_letter.table}
    down = tmp_path / "dependency-down"
    down.touch()
    log_path = tmp_path / "job.log"
    command = retrylib_command("run", config.source_path, "--master", "local[2]")
    env = job_env({"RETRYLIB_TEST_DEPENDENCY_DOWN": str(down)})

    upkept = {"batches": 0}

    def upkeep_until(enough: Callable[[], bool]) -> bool:
        # A round of upkeep on each table after each batch the job logged, then the
        # question. A table is looked for on disk: Delta's `isDeltaTable` answers from the
        # session's cached log of the path, which stays empty once asked too early.
        batches = log_path.read_text().count("retrylib.batch.commit: batch ")
        if batches == upkept["batches"]:
            return False
        upkept["batches"] = batches
        for table in tables.values():
            if Path(table, "_delta_log").is_dir():
                delta = DeltaTable.forPath(spark, table)
                delta.optimize().executeCompaction()
                delta.vacuum()
        return enough()

    with running_job(command, env, log_path) as job:
        dead_lettered = lambda: read_table_rows(tables["dead letter"]) >= KEYS  # noqa: E731
        wait_for(lambda: upkeep_until(dead_lettered), 300, "the dead letters", job)
        down.unlink()
        code, _, err = run_cli(capsys, "redrive", config.source_path)
        assert code == 0, err[-3000:]
        handled = lambda: read_table_rows(tables["output"]) >= 2 * KEYS  # noqa: E731
        wait_for(lambda: upkeep_until(handled), 300, "every record handled", job)
        job.send_signal(signal.SIGTERM)
        job.wait(timeout=120)
    log = log_path.read_text()
    assert job.returncode == 0, log[-3000:]
    assert "Traceback" not in log

    assert sorted(read_table(tables["output"]).column("key").to_pylist()) == sorted(keys)
    dead = read_table(tables["dead letter"]).to_pylist()
    assert sorted(row["key"].decode() for row in dead) == sorted(k for k in keys if "dep" in k)
    assert all(row["redriven_at"] is not None for row in dead)
    for name, table in tables.items():
        history = DeltaTable.forPath(spark, table).history()
        operations = {row.operation for row in history.select("operation").collect()}
        assert "OPTIMIZE" in operations, f"no OPTIMIZE of the {name} table committed"
