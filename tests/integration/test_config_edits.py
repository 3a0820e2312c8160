"""Config edits between runs, as an operator makes them over a job's months: the job is run
with the `retrylib` command after each edit, from the same checkpoint (the runs it refuses in
the test's process, `run_cli`), and every input must still have exactly one effect (the
fault harness's checks, tests/faults/harness.py)."""

from __future__ import annotations

import random
import re
import signal
import sys
import time
import uuid
from pathlib import Path

FAULTS_DIR = Path(__file__).resolve().parents[1] / "faults"
sys.path.insert(0, str(FAULTS_DIR))

import pyarrow as pa  # noqa: E402
import pytest  # noqa: E402
from confluent_kafka import KafkaException  # noqa: E402
from confluent_kafka.admin import NewTopic  # noqa: E402
from harness import FaultsJob  # noqa: E402
from helpers import (  # noqa: E402
    job_env,
    metrics_totals,
    produce,
    retrylib_command,
    run_cli,
    run_job_available_now,
    running_job,
    wait_for,
)

from retrylib.config.topic_names import produced_topic  # noqa: E402
from retrylib.errors import TopicError  # noqa: E402
from retrylib.kafka.clients import make_admin, make_producer  # noqa: E402
from retrylib.sinks.outgoing_records import OUTGOING_SCHEMA  # noqa: E402
from retrylib.sinks.transactional_producer import UnitProducer  # noqa: E402


def _run_until_settled(job: FaultsJob, log: Path) -> None:
    """`retrylib run` the job until every input has its effect and nothing changes for a
    while (longer than its longest retry delay), then stop it with SIGINT."""
    command = retrylib_command("run", str(job.workdir / "job.toml"), "--master", "local[2]")
    with running_job(command, job_env({"RETRYLIB_LOG_LEVEL": "INFO"}), log) as process:
        note = job.wait_settled(process, log, timeout=300, settle=5)
        process.send_signal(signal.SIGINT)
        assert process.wait(60) == 0, log.read_text()[-3000:]
    assert note.startswith("settled"), f"{note}\n{log.read_text()[-3000:]}"


def test_a_retry_tier_taken_out_and_put_back_is_read_on_from_where_it_was(
    bootstrap_servers, make_topic, tmp_path, spark, capsys
):
    """The 2s tier is taken out of the config and put back: its records handled before are
    not read again (they were, from its earliest record, and handled twice). Taken out while
    a retry waits in it, the job refuses to start (it started, and the retry was lost)."""
    rng = random.Random(43)
    topic = make_topic("orders", partitions=2)
    job = FaultsJob(bootstrap_servers, topic, tmp_path, name="edits")
    for run, delays in enumerate((["1s", "2s"], ["1s"], ["1s", "2s"])):
        job.write_config(retry={"delays": delays})
        job.produce_wave(rng, 30)
        _run_until_settled(job, tmp_path / f"run-{run}.log")
    job.check(spark)

    # A retry of this job waits in the 2s tier (as one stopped mid-delay leaves it): taking
    # the tier out now would strand it, and both check and run refuse, naming it.
    stranded_in = job.tier_topics[1]
    producer = make_producer(bootstrap_servers, {})
    producer.produce(stranded_in, key=b"k", value=b"v", headers=[("retrylib.job", b"edits")])
    producer.flush(10)
    job.write_config(retry={"delays": ["1s"]})
    refusal = f"retry topic {stranded_in!r} is no longer in retry.delays, but 1 retry record"
    code, _, err = run_cli(capsys, "check", str(job.workdir / "job.toml"))
    assert code != 0 and f"error: {refusal}" in err, err
    code, _, err = run_cli(capsys, "run", str(job.workdir / "job.toml"), "--available-now")
    assert code != 0, err[-3000:]
    assert any(line.startswith(f"error: {refusal}") for line in err.splitlines()), err[-3000:]
    assert "Traceback" not in err

    # The tier is deleted and created again with one partition (of two), and put back in the
    # config: the job's position in it went with the old topic, and run stops at its first
    # batch naming the topic and what changed (it read nothing of the new topic, in silence).
    _recreate(bootstrap_servers, stranded_in, partitions=1)
    job.write_config(retry={"delays": ["1s", "2s"]})
    code, _, err = run_cli(capsys, "run", str(job.workdir / "job.toml"), "--available-now")
    assert code != 0, err[-3000:]
    changed = f"error: topic(s) deleted and created again since the job read them ('{stranded_in}'"
    lines = [line for line in err.splitlines() if line.startswith(changed)]
    assert len(lines) == 1, err[-5000:]
    [line] = lines
    assert "partition 1 is gone" in line and "kafka.fail_on_data_loss = false" in line, line
    assert "Traceback" not in err


def test_a_lowered_max_attempts_dead_letters_the_retries_already_waiting(
    bootstrap_servers, make_topic, write_config, spark, capsys
):
    """retry.max_attempts lowered from 3 to 2 while a record waits for its third call (it
    would succeed then): the `retrylib` command dead-letters it without calling the handler,
    with 2 attempts (it was called a third time, and dead-lettered with 3 when it failed)."""
    topic = make_topic("lowered", partitions=1)
    produce(bootstrap_servers, topic, [("flaky2-a", "v"), ("ok-b", "v")])
    retry = {"delays": ["1s", "2s"], "max_attempts": 3}
    config = write_config([topic], name="lowered", retry=retry)
    # An availableNow run reads a tier up to what was due at its start: each run makes one
    # call of the record, and leaves its retry waiting in the next tier.
    for _ in range(2):
        code, _, err = run_cli(capsys, "run", config.source_path, "--available-now")
        assert code == 0, err[-3000:]
    time.sleep(2.5)  # the retry in the 2s tier is due
    config = write_config([topic], name="lowered", retry={**retry, "max_attempts": 2})

    lowered = run_job_available_now(config.source_path, timeout=300)

    assert lowered.returncode == 0, lowered.stderr[-3000:]
    output = spark.read.format("delta").load(config.output.table).select("key")
    assert sorted(row.key for row in output.collect()) == ["ok-b"]
    dead = spark.read.format("delta").load(config.dead_letter.table).collect()
    assert [(row.key, row.attempts, row.reason) for row in dead] == [
        (b"flaky2-a", 2, "attempts_exhausted")
    ]
    assert "retry.max_attempts is 2" in dead[0].error_message


def test_retries_waiting_in_a_tier_deleted_under_the_job_are_counted_as_lost(
    bootstrap_servers, make_topic, write_config, tmp_path
):
    """A retry tier deleted and created again while the job runs, with
    `kafka.fail_on_data_loss = false`: the job goes on, and the retries that waited in the
    old tier are a batch's `records_lost` (they were only in a warning, issue 43 item 3):
    five records and the commit marker of the transaction that wrote them, six offsets."""
    topic = make_topic("lost", partitions=1)
    config = write_config(
        [topic], name="lost", kafka={"fail_on_data_loss": False}, retry={"delays": ["10m"]}
    )
    [tier] = config.retry.tier_topics()
    produce(bootstrap_servers, topic, [(f"flaky2-{i}", "v") for i in range(5)])
    log = tmp_path / "job.log"
    command = retrylib_command("run", config.source_path, "--master", "local[2]")
    with running_job(command, job_env(), log) as process:
        wait_for(
            lambda: metrics_totals(log.read_text()).get("main_failed") == 5,
            240,
            "5 failed records",
            process,
        )
        # The reader counts what it saw waiting: a batch planned after the retries' batch
        # ended has looked at the tier's tail. (Deleted before that look, the tier would be
        # as the reader last saw it, empty, and its records would go uncounted.)
        produce(bootstrap_servers, topic, [("ok-before", "v")])
        wait_for(
            lambda: metrics_totals(log.read_text()).get("succeeded") == 1,
            120,
            "the first success",
            process,
        )
        # At once: the next plan looks once at the tier's new tail (records, or only a
        # marker?), and a look at the new, empty topic must not pass the tail as markers.
        _recreate(bootstrap_servers, tier, partitions=1)
        produce(bootstrap_servers, topic, [("ok-after", "v")])
        wait_for(
            lambda: metrics_totals(log.read_text()).get("succeeded") == 2,
            120,
            "the second success",
            process,
        )
        wait_for(
            lambda: metrics_totals(log.read_text())["records_lost"] > 0,
            60,
            "records counted lost",
            process,
        )
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0, log.read_text()[-3000:]
    text = log.read_text()
    assert metrics_totals(text)["records_lost"] == 6, text[-5000:]
    assert "the 6 record(s) that waited there unread are lost" in text, text[-5000:]
    assert "Traceback" not in text


def _recreate(bootstrap: str, topic: str, partitions: int) -> None:
    """Delete `topic` and create it again with `partitions` partitions."""
    admin = make_admin(bootstrap, {})
    admin.delete_topics([topic])[topic].result(30)
    deadline = time.monotonic() + 30
    while True:  # the broker refuses the name until the deletion is done
        try:
            admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
            return
        except KafkaException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_a_record_for_a_partition_its_topic_no_longer_has_fails_the_produce_at_once(
    bootstrap_servers,
):
    """A tier deleted under the running job and created again with fewer partitions: producing
    to a partition it lost names the topic and the change at once (it was retried through
    "Unknown partition" until the produce gave up, and then again by the next attempt)."""
    job = f"changed-{uuid.uuid4().hex[:10]}"
    topic = f"{job}-tier"
    admin = make_admin(bootstrap_servers, {})
    created = admin.create_topics([NewTopic(name, 1, 1) for name in (topic, produced_topic(job))])
    for future in created.values():
        future.result(30)
    producer = UnitProducer(job, f"{job}-app", 0, bootstrap_servers, {}, signing_key=b"k" * 32)
    record = pa.RecordBatch.from_pylist(
        [{"topic": topic, "partition": 1, "timestamp_ms": 0, "key": b"k", "value": b"v"}],
        schema=OUTGOING_SCHEMA,
    )
    started = time.monotonic()
    try:
        expected = f"topic '{topic}' has 1 partition(s) and the job produces to its partition 1"
        with pytest.raises(TopicError, match=re.escape(expected)):
            producer.produce_once(0, lambda: iter([record]), 0)
    finally:
        producer.close()
    assert time.monotonic() - started < 20
