"""Every handler call is bounded, whatever the handler catches or blocks in: through
spark-submit.sh, each way a call can resist being stopped (handlers/timeout_handlers.py)
ends as a dead letter with its timeout, every other record lands once, the runs end by
themselves, and a SIGTERM while such calls run stops the job within its bound."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers import (
    job_env,
    logged_metrics,
    metrics_totals,
    produce,
    read_table,
    running_job,
    wait_for,
)

from retrylib.job import start_query

REPO = Path(__file__).resolve().parents[2]
STUBBORN = ("loop", "catchall", "sigblock", "cwait", "gil")
"""The prefixes of timeout_handlers.py whose calls never return."""
UNSTOPPABLE = STUBBORN[1:]
"""Of those, the calls an interrupt does not stop: the watchdog ends their process."""


def spark_submit(config_path: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(REPO / "spark-submit.sh"), config_path, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )


def test_calls_that_resist_their_timeout_are_dead_lettered_and_the_rest_land_once(
    bootstrap_servers, make_topic, write_config, tmp_path
):
    topic = make_topic("orders", partitions=2)
    keys = [f"ok-{i}" for i in range(20)] + [f"{prefix}-0" for prefix in STUBBORN]
    produce(bootstrap_servers, topic, [(key, f"v-{key}") for key in keys], partitions=2)
    config = write_config(
        [topic],
        handler="timeout_handlers:by_key",
        handler_options={"timeout": "1s"},
        retry={"delays": ["1s"], "max_attempts": 2},
    )
    env = job_env({"RETRYLIB_SPARK_EXTRA": "--master local[2]"})

    logs = []
    for _ in range(2):  # attempt 0 of each stubborn record, then its retry, due after 1s
        started = time.monotonic()
        done = spark_submit(config.source_path, "--available-now", env=env)
        logs.append(done.stdout + done.stderr)
        assert done.returncode == 0, logs[-1][-4000:]
        assert time.monotonic() - started < 240, "a run did not end by itself in its bound"
        time.sleep(1.2)

    output = read_table(config.output.table).column("key").to_pylist()
    assert sorted(output) == sorted(k for k in keys if k.startswith("ok-"))  # each once
    dead = {row["key"].decode(): row for row in read_table(config.dead_letter.table).to_pylist()}
    assert sorted(dead) == sorted(f"{prefix}-0" for prefix in STUBBORN)
    for row in dead.values():
        assert (row["reason"], row["attempts"]) == ("attempts_exhausted", 2), row
        assert row["error_class"] == "retrylib.handler.HandlerTimeout", row
    assert dead["loop-0"]["error_message"] == "handler did not return within 1s"
    for prefix in UNSTOPPABLE:
        assert dead[f"{prefix}-0"]["error_message"] == (
            "handler did not return within 1s, nor stop when interrupted: its process was "
            "ended 2s later"
        )

    for log in logs:
        # Each run: its worker ended by the watchdog, the batch run again with a process per
        # call, and each call past its bound named at ERROR, and counted.
        assert "ERROR retrylib.task.watchdog: ending Python worker" in log, log[-4000:]
        assert "running the batch again with each handler call in its own process" in log
        for prefix in UNSTOPPABLE:
            at = keys.index(f"{prefix}-0")  # produced round-robin over the two partitions
            assert (
                f"ERROR retrylib.task.call_bounds: handler on {topic}[{at % 2}]@{at // 2} did "
                "not stop within 2s of handler.timeout 1s, interrupted: its process was ended"
            ) in log, prefix
        totals = metrics_totals(log)
        assert totals["calls_timed_out"] == len(STUBBORN), logged_metrics(log)
        assert totals["call_processes_ended"] == len(UNSTOPPABLE), logged_metrics(log)


def test_sigterm_while_calls_resist_their_timeout_stops_within_the_stop_timeout(
    bootstrap_servers, make_topic, write_config, tmp_path
):
    """Five Python workers, each in a call that resists in its own way (and a timeout far
    off): SIGTERM to spark-submit's JVM, as a cluster manager sends it, ends the job within
    job.stop_timeout and Spark's kill of its tasks, with one line."""
    topic = make_topic("orders", partitions=len(STUBBORN))
    produce(bootstrap_servers, topic, [(f"{prefix}-0", "v") for prefix in STUBBORN], partitions=5)
    config = write_config(
        [topic],
        handler="timeout_handlers:by_key",
        handler_options={"timeout": "5m"},
        job={"stop_timeout": "3s"},
    )
    marks = tmp_path / "marks"
    marks.mkdir()
    env = job_env(
        {
            "RETRYLIB_SPARK_EXTRA": f"--master local[{len(STUBBORN)}]",
            "RETRYLIB_TEST_MARKS": str(marks),
        }
    )
    log_path = tmp_path / "job.log"
    with running_job([str(REPO / "spark-submit.sh"), config.source_path], env, log_path) as job:
        wait_for(
            lambda: {mark.name.split("-")[0] for mark in marks.iterdir()} == set(STUBBORN),
            240,
            "every stubborn call to start",
            job,
        )
        job.send_signal(signal.SIGTERM)  # spark-submit.sh execs the JVM: this pid is it
        signalled = time.monotonic()
        job.wait(timeout=120)
    took = time.monotonic() - signalled
    log = log_path.read_text()
    assert job.returncode == 0, log[-4000:]
    assert took < 45, f"the stop took {took:.0f}s"
    (stopped,) = log.split("stopping after the current batch\n", 1)[1].strip().splitlines()
    assert "did not finish within 3s and runs again at the next start" in stopped, log[-4000:]


@pytest.mark.parametrize("kind", ["lanes", "record_hook", "arrow"])
def test_every_kind_of_user_call_is_bounded(
    spark, bootstrap_servers, make_topic, write_config, kind
):
    """On lanes, in a record hook and in a vectorised handler, a call that does not stop has
    its worker ended, and the batch run again with a process per call gives each record one
    final outcome: the resisting call's records a dead letter (a hook's record, its row)."""
    topic = make_topic("orders", partitions=2)
    stubborn = {"lanes": "catchall-0", "record_hook": "hookstuck-0", "arrow": "catchall-0"}[kind]
    keys = [stubborn] + [f"ok-{i}" for i in range(11)]
    produce(bootstrap_servers, topic, [(key, f"v-{key}") for key in keys], partitions=2)
    options = {
        "lanes": ({"parallelism": 3}, {}),
        "record_hook": ({}, {"hooks": {"before_record": "timeout_handlers:stubborn_hook"}}),
        "arrow": ({"kind": "arrow", "function": "timeout_handlers:arrow_by_key"}, {}),
    }
    handler_options, sections = options[kind]
    config = write_config(
        [topic],
        handler="timeout_handlers:by_key",
        handler_options={"timeout": "1s", **handler_options},
        retry={"delays": ["1s"], "max_attempts": 1},
        **sections,
    )

    results = []
    query, router = start_query(spark, config, available_now=True, on_result=results.append)
    query.awaitTermination(240)
    router.close()
    assert query.exception() is None
    counted = {
        name: sum(result.counters.get(name, 0) for result in results)
        for name in ("calls_timed_out", "call_processes_ended", "hook_errors")
    }
    # The stubborn call, once, in the batch run again with a process per call.
    assert counted == {
        "calls_timed_out": 1,
        "call_processes_ended": 1,
        "hook_errors": 1 if kind == "record_hook" else 0,
    }

    output = read_table(config.output.table).column("key").to_pylist()
    dead = {row["key"].decode(): row for row in read_table(config.dead_letter.table).to_pylist()}
    assert sorted(output + list(dead)) == sorted(keys)  # each record once, one way or the other
    assert len(output) == len(set(output))
    if kind == "record_hook":
        assert not dead  # a hook cannot fail its record
        return
    assert stubborn in dead
    for row in dead.values():
        assert row["error_class"] == "retrylib.handler.HandlerTimeout", row
        assert row["error_message"].endswith("its process was ended 2s later"), row
    if kind == "lanes":
        assert list(dead) == [stubborn]
