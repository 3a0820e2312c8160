"""Storage the job cannot write: one clear error from `retrylib run`, and exactly once after.

The output table's `_delta_log` refuses new files while the job runs a batch, or the file
system of the checkpoint and tables fills up; the job stops with exit code 1 and one message
naming the path and what to do (no Python traceback). Once the storage takes writes again, a
rerun writes every record once. The failing run is a process of its own, as a user meets it
(all it prints counts); the others run in the test's process (`run_cli`).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

from chispa import assert_df_equality
from helpers import produce, refusing_writes, run_cli, run_job_available_now


def test_a_read_only_delta_log_is_one_clear_error_and_recovery_is_exactly_once(
    spark, bootstrap_servers, make_topic, write_config, capsys
):
    topic = make_topic("rotable", partitions=2)
    first = [(f"ok-a{i}", "v") for i in range(20)]
    produce(bootstrap_servers, topic, first, partitions=2)
    config = write_config([topic], name="rotable")
    output = Path(config.output.table)
    code, _, err = run_cli(capsys, "run", config.source_path, "--available-now")
    assert code == 0, err[-5000:]

    second = [(f"ok-b{i}", "v") for i in range(20)]
    produce(bootstrap_servers, topic, second, partitions=2)
    with refusing_writes(output / "_delta_log"):
        failed = run_job_available_now(config.source_path, timeout=300)

    assert failed.returncode == 1, failed.stderr[-3000:]
    last = failed.stderr.strip().splitlines()[-1]
    assert last.startswith("error: cannot append batch 1 to the table of output.table ")
    assert f"(at {output})" in last
    assert "_delta_log" in last and "permissions" in last and "restart the job" in last
    assert "Traceback" not in failed.stderr and "\tat " not in failed.stderr
    assert "\x1b[" not in failed.stderr  # no terminal colour codes
    assert len(failed.stderr.splitlines()) < 20, failed.stderr[-3000:]

    code, _, err = run_cli(capsys, "run", config.source_path, "--available-now")

    assert code == 0, err[-3000:]
    expected = spark.createDataFrame([(key,) for key, _ in first + second], "key STRING")
    written = spark.read.format("delta").load(str(output)).select("key")
    assert_df_equality(written, expected, ignore_row_order=True, ignore_nullable=True)


@contextlib.contextmanager
def _small_file_system(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` mounted at `path` (made) while the block runs: a disk that fills up."""
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "--lazy", str(path)], check=False)


def test_a_full_disk_is_one_line_naming_the_folder_and_recovery_is_exactly_once(
    spark, bootstrap_servers, make_topic, write_config, capsys, tmp_path
):
    topic = make_topic("fulldisk", partitions=2)
    # Keys of random text: the batch's staged decisions cannot be compressed below 1 MB.
    records = [(f"ok-{i}-{os.urandom(500).hex()}", "v") for i in range(2000)]
    produce(bootstrap_servers, topic, records, partitions=2)
    with _small_file_system(tmp_path / "small", "1m") as small:
        config = write_config(
            [topic],
            name="fulldisk",
            job={"checkpoint": f"{small}/checkpoint"},
            output={"table": f"{small}/out"},
            dead_letter={"table": f"{small}/dlq"},
        )
        failed = run_job_available_now(config.source_path, timeout=300)

        assert failed.returncode == 1, failed.stderr[-3000:]
        last = failed.stderr.strip().splitlines()[-1]
        assert last.startswith(f"error: no space left on the file system of file:{small}/"), last
        assert "restart the job" in last
        assert "Traceback" not in failed.stderr

        subprocess.run(["mount", "-o", "remount,size=64m", str(small)], check=True)
        code, _, err = run_cli(capsys, "run", config.source_path, "--available-now")

        assert code == 0, err[-3000:]
        expected = spark.createDataFrame([(key,) for key, _ in records], "key STRING")
        written = spark.read.format("delta").load(f"{small}/out").select("key")
        assert_df_equality(written, expected, ignore_row_order=True, ignore_nullable=True)
