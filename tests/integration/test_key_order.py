"""Key order (`retry.key_ordered`) through `retrylib run` as a user runs it: while a record
waits in a retry tier, its key's later records wait behind it; dead-lettering it releases
the key; other keys never wait; the queues survive a restart."""

from __future__ import annotations

import json
import signal
from collections import defaultdict
from pathlib import Path

import pytest
from faults.crash.crash_points import crash_env
from helpers import (
    job_env,
    logged_metrics,
    produce,
    read_table,
    retrylib_command,
    run_cli,
    run_retrylib,
    running_job,
    wait_for_rows,
)

# key -> values in the order produced; "fail:N" fails N times first, "never" always fails.
RECORDS = {
    "a": ["fail:2", "a1", "a2", "fail:1", "a4"],
    "b": ["never", "b1", "b2"],
    "c": [f"c{i}" for i in range(10)],
}


def interleaved(records: dict[str, list[str]]) -> list[tuple[str, str]]:
    """(key, value) pairs, the keys' records taking turns, each key's in its order."""
    longest = max(len(values) for values in records.values())
    return [
        (key, values[i])
        for i in range(longest)
        for key, values in records.items()
        if i < len(values)
    ]


def successes(call_log: Path) -> dict[str, list[dict]]:
    """Each key's successful handler calls, in the order they happened."""
    by_key: dict[str, list[dict]] = defaultdict(list)
    calls = [json.loads(line) for line in call_log.read_text().splitlines()]
    for call in sorted(calls, key=lambda c: c["time"]):
        by_key[call["key"]].append(call)
    return by_key


def ordered_job(bootstrap_servers, make_topic, write_config, tmp_path, **sections):
    """A key-ordered job over a topic holding `RECORDS`, and the environment to run it with;
    `sections` add to its config's tables."""
    topic = make_topic("orders", partitions=2)
    produce(bootstrap_servers, topic, interleaved(RECORDS))  # keyed: a key stays in a partition
    config = write_config(
        [topic],
        handler="key_order_handlers:ordered",
        kafka={"source": "python", **sections.pop("kafka", {})},
        retry={"delays": ["1s", "2s"], "max_attempts": 3, "key_ordered": True},
        **sections,
    )
    env = job_env(
        {"RETRYLIB_TEST_CALL_LOG": str(tmp_path / "calls.jsonl"), "RETRYLIB_LOG_FORMAT": "json"}
    )
    return config, env


def run_until_done(
    config, env: dict[str, str], log_path: Path, records: dict[str, list[str]] = RECORDS
) -> str:
    """Run the job until every record of `records` that can succeed is in the output; its
    log."""
    command = retrylib_command("run", config.source_path, "--master", "local[2]")
    expected = sum(len(values) for values in records.values()) - 1  # "never" is dead-lettered
    with running_job(command, env, log_path) as job:
        wait_for_rows(job, log_path, config.output.table, lambda rows: rows >= expected, 240)
        job.send_signal(signal.SIGTERM)
        job.wait(timeout=120)
    log = log_path.read_text()
    assert job.returncode == 0, log[-3000:]
    return log


def assert_handled_in_key_order(
    config, call_log: Path, records: dict[str, list[str]] = RECORDS
) -> None:
    """Each key's records succeeded in the order produced, once each; "never" was
    dead-lettered once."""
    by_key = successes(call_log)
    for key, values in records.items():
        handled = [call["value"] for call in by_key[key]]
        assert handled == [v for v in values if v != "never"], key  # in order, each once
    # "a" waited for its first record's two retries.
    assert by_key["a"][0]["attempt"] == 2 and by_key["a"][3]["attempt"] == 1
    dead = read_table(config.dead_letter.table).to_pylist()
    assert [(row["key"], row["value"], row["attempts"]) for row in dead] == [(b"b", b"never", 3)]
    output = read_table(config.output.table).column("value").to_pylist()
    assert sorted(output) == sorted(
        v for values in records.values() for v in values if v != "never"
    )


@pytest.mark.parametrize(
    "sections",
    [
        pytest.param({}, id="one-batch"),
        # A few records a batch, so a blocked key's new records come in later batches than
        # its retry, and lanes: a task calls the handler for four keys at once.
        pytest.param(
            {"kafka": {"max_offsets_per_trigger": 4}, "handler_options": {"parallelism": 4}},
            id="small-batches-and-lanes",
        ),
    ],
)
def test_a_keys_records_wait_behind_its_retry(
    bootstrap_servers, make_topic, write_config, tmp_path, sections
):
    config, env = ordered_job(bootstrap_servers, make_topic, write_config, tmp_path, **sections)

    log = run_until_done(config, env, tmp_path / "job.log")

    assert_handled_in_key_order(config, tmp_path / "calls.jsonl")
    if not sections:  # all read in one batch: "c" did not wait for "a"'s retries
        by_key = successes(tmp_path / "calls.jsonl")
        assert by_key["c"][-1]["time"] < by_key["a"][0]["time"]
    held = sum(line["held_behind_key"] for line in logged_metrics(log))
    assert held >= 5  # a1, a2, a4, b1, b2 at least once each


def test_the_queues_survive_crashes_on_either_side_of_their_update(
    bootstrap_servers, make_topic, write_config, tmp_path, capsys
):
    config, env = ordered_job(bootstrap_servers, make_topic, write_config, tmp_path)
    # The first batch blocks "a" and "b". Crash after its tables' commits, before its
    # queues are stored; then, on the replay, right after they are.
    for point in ("after_dead_letter_commit", "before_batch_end"):
        crashed = run_retrylib(
            "run",
            config.source_path,
            "--master",
            "local[2]",
            env={**env, **crash_env(point, batch=0)},
            new_session=True,
        )
        assert f"crash at {point} in batch 0" in crashed.stderr, crashed.stderr[-3000:]
    code, out, err = run_cli(capsys, "status", config.source_path, "--json")
    assert code == 0, err[-3000:]
    key_order = json.loads(out)["key_order"]
    assert (key_order["blocked_keys"], key_order["after_batch"]) == (2, 0)  # "a" and "b"
    assert key_order["held_records"] == 2 + 4  # behind them: b1, b2 and a1 to a4
    _, text, _ = run_cli(capsys, "status", config.source_path)
    assert "key order: 2 key(s) wait behind a retry, 6 record(s) held behind them" in text
    # New records of a blocked key, read after the restart: they wait too.
    produce(bootstrap_servers, config.kafka.topics[0], [("a", "a5"), ("a", "a6")])
    records = {**RECORDS, "a": [*RECORDS["a"], "a5", "a6"]}

    log = run_until_done(config, env, tmp_path / "job.log", records)

    assert "key(s) waiting behind retries after batch 0" in log  # stored once, kept
    assert_handled_in_key_order(config, tmp_path / "calls.jsonl", records)
    folder = Path(config.job.checkpoint) / "retrylib" / "key_order"
    newest = max(folder.glob("*.json"), key=lambda path: int(path.stem))
    assert json.loads(newest.read_text())["queues"] == []  # every key released
