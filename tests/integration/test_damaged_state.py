"""State changed or damaged outside the job stops it with one line from `retrylib run` that
names the table or file and the way out, before any effect; put right, the job goes on
exactly once.

- A table older than its checkpoint (its latest commit removed, as a restore from an older
  backup does): the next batch would take the lost commit's place in silence.
- A manifest of the batch in flight cut short: the batch's effects may be made from it in
  part, so it is not routed again.
- Spark's latest offsets file cut short: Spark would fail on its own parse error.
- The record of the checkpoint's main-topic reader cut short, or a config naming the other
  reader: Spark would fail to resume the query with no word of why.

Runs go through the CLI's `main` in this process, on the tests' Spark session.
"""

from __future__ import annotations

from pathlib import Path

from chispa import assert_df_equality
from helpers import assert_one_error_line, produce, run_available_now, run_cli

from retrylib.state.checkpoint import Checkpoint


def assert_keys(spark, output: Path, records: list[tuple[str, str]]) -> None:
    expected = spark.createDataFrame([(key,) for key, _ in records], "key STRING")
    written = spark.read.format("delta").load(str(output)).select("key")
    assert_df_equality(written, expected, ignore_row_order=True, ignore_nullable=True)


def assert_run_fails(capsys, config, start: str, *parts: str) -> None:
    """`retrylib run CONFIG --available-now` exits 1 with one line naming what is wrong."""
    code, _, err = run_cli(capsys, "run", config.source_path, "--available-now")
    assert_one_error_line(code, err, start, *parts)


def cut_in_half(path: Path) -> bytes:
    """Keep the first half of the file at `path` (a write cut short); returns what it held."""
    kept = path.read_bytes()
    path.write_bytes(kept[: len(kept) // 2])
    return kept


def test_a_table_older_than_its_checkpoint_stops_the_job_before_an_append(
    spark, bootstrap_servers, make_topic, write_config, tmp_path, capsys
):
    topic = make_topic("behind", partitions=2)
    first = [(f"ok-a{i}", "v") for i in range(20)]
    produce(bootstrap_servers, topic, first, partitions=2)
    config = write_config([topic], name="behind")
    output = Path(config.output.table)
    run_available_now(spark, config)
    log = output / "_delta_log"
    latest = max(log.glob("*.json")).stem  # batch 0's append
    removed = tmp_path / "removed"
    removed.mkdir()
    for commit in log.glob(f"*{latest}*"):  # the commit, its .crc, Hadoop's checksum of both
        commit.rename(removed / commit.name)

    second = [(f"ok-b{i}", "v") for i in range(20)]
    produce(bootstrap_servers, topic, second, partitions=2)
    assert_run_fails(
        capsys,
        config,
        f"the output table {output} holds no batch of ",
        "batch 0 of the checkpoint appended rows to it",
        "Restore the table's latest version",
    )
    assert spark.read.format("delta").load(str(output)).count() == 0  # nothing took its place

    for commit in removed.iterdir():
        commit.rename(log / commit.name)
    run_available_now(spark, config)
    assert_keys(spark, output, first + second)


def test_damaged_checkpoint_files_are_named_with_the_way_out(
    spark, bootstrap_servers, make_topic, write_config, capsys
):
    topic = make_topic("damaged", partitions=1)
    records = [(f"ok-{i}", "v") for i in range(10)]
    produce(bootstrap_servers, topic, records)
    config = write_config([topic], name="damaged")
    run_available_now(spark, config)
    checkpoint = Checkpoint(config.job.checkpoint)
    # Batch 0 as a crash after its manifest leaves it: not marked complete, so Spark runs it
    # again, from the manifest. Cut short, the manifest cannot be trusted.
    commit = Path(checkpoint.spark) / "commits" / "0"
    commit.unlink()
    Path(checkpoint.spark, "commits", ".0.crc").unlink(missing_ok=True)
    manifest = Path(checkpoint.manifest(0))
    kept = cut_in_half(manifest)

    assert_run_fails(
        capsys,
        config,
        f"the manifest of batch 0, {manifest}, is damaged (not JSON: ",
        "Restore the file from a backup, or start the job from a new checkpoint",
    )

    offsets = Path(checkpoint.spark) / "offsets" / "0"
    kept_offsets = cut_in_half(offsets)
    assert_run_fails(
        capsys,
        config,
        f"Spark's offsets file {offsets} is damaged (",
        "batch 0 was routed from it: restore the file from a backup",
    )

    offsets.write_bytes(kept_offsets)
    manifest.write_bytes(kept)
    reader = Path(checkpoint.state) / "main_reader.json"
    assert reader.read_text() == '{"source": "python"}'  # "auto" on a new checkpoint
    kept_reader = cut_in_half(reader)
    assert_run_fails(
        capsys,
        config,
        f"{reader} is damaged (not JSON: ",
        "remove it and set kafka.source to the reader this checkpoint was started with",
    )
    reader.write_bytes(kept_reader)
    builtin = write_config([topic], name="damaged", kafka={"source": "builtin"})
    assert_run_fails(
        capsys,
        builtin,
        'kafka.source = "builtin", but this checkpoint was started reading the main topics '
        f'with "python" ({reader})',
        'set kafka.source = "python" (or "auto")',
    )

    run_available_now(spark, config)
    assert_keys(spark, Path(config.output.table), records)
