"""The `retrylib` command against the broker and real Delta tables: run, check, status, redrive.

One small job run (module fixture, through `retrylib run --available-now`) leaves records in
a retry tier, rows in the dead-letter table and a metrics row; the tests read and redrive
those. Each redrive test picks its own rows by id or error class, so none depends on
another having run.

Most tests call the command's `main` in this process (it then reads the tables through the
test session); one runs it as a process of its own, as a user does, which starts its own
Spark. The tables here are named by path: a catalog name made in this process's session
(an in-memory catalog) does not exist for another process. Catalog names are tested
in-process in `test_redrive.py`.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import sys
import uuid
from pathlib import Path

import pytest
from delta.tables import DeltaTable
from helpers import (
    logged_metrics,
    read_table,
    read_topic,
    run_cli,
    run_retrylib,
    write_job_toml,
)

import retrylib.ops.redrive as redrive_module
from retrylib.config.loader import load_config
from retrylib.kafka.clients import make_producer
from retrylib.ops.cli import main

HANDLERS_DIR = Path(__file__).parent / "handlers"
SECRET = f"s3cr3t-{uuid.uuid4().hex}"
SECRET_VARIABLE = "RETRYLIB_TEST_KAFKA_PASSWORD"
OUTPUT_SCHEMA = "key STRING, value STRING, topic STRING, partition INT, offset BIGINT, attempt INT"
RECORDS = (
    [(f"ok-{i}", "fine") for i in range(4)]
    + [(f"bad-{i}", "broken") for i in range(3)]  # ValueError: non-retryable
    + [(f"stop-{i}", "halt") for i in range(5)]  # NonRetryable
    + [(f"always-{i}", "again") for i in range(3)]  # RuntimeError: waits in tier 1 (30m)
)


def job_config(tmp: Path, bootstrap: str, topic: str, name: str = "clitest") -> Path:
    return write_job_toml(
        tmp / f"{name}.toml",
        topics=[topic],
        name=name,
        bootstrap_servers=bootstrap,
        handler={
            "function": "job_handlers:by_key",
            "output_schema": OUTPUT_SCHEMA,
            "paths": [HANDLERS_DIR],
        },
        job={"trigger": "500ms"},
        kafka={"options": {"sasl.password": f"${{env:{SECRET_VARIABLE}}}"}},
        retry={"delays": ["30m", "1h"], "max_attempts": 3, "non_retryable": ["ValueError"]},
        dead_letter={"topic": f"{topic}.dlt", "table": f"{tmp}/dlq"},
        metrics={"table": f"{tmp}/metrics"},
    )


@contextlib.contextmanager
def captured_logging():
    """Capture what the CLI prints and logs; put the root logger back afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            yield out, err
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


@pytest.fixture(scope="module")
def job(spark, bootstrap_servers, make_topic, tmp_path_factory):
    """A job run once: returns (config path, topic, exit code, stdout, stderr)."""
    previous = os.environ.get(SECRET_VARIABLE)
    os.environ[SECRET_VARIABLE] = SECRET
    sys.path.insert(0, str(HANDLERS_DIR))
    topic = make_topic("clijob", partitions=2)
    producer = make_producer(bootstrap_servers, {})
    for i, (key, value) in enumerate(RECORDS):
        producer.produce(
            topic,
            key=key.encode(),
            value=value.encode(),
            partition=i % 2,
            headers=[("trace", b"t-" + key.encode()), ("retrylib.attempt", b"7")],
        )
    producer.flush(30)
    path = job_config(tmp_path_factory.mktemp("clijob"), bootstrap_servers, topic)
    with captured_logging() as (out, err):
        code = main(["run", str(path), "--available-now"])
    yield path, topic, code, out.getvalue(), err.getvalue()
    if previous is None:
        os.environ.pop(SECRET_VARIABLE, None)
    else:
        os.environ[SECRET_VARIABLE] = previous


def config_of(job):
    return load_config(job[0], check_imports=False)


def dead_letters(job) -> list[dict]:
    return read_table(config_of(job).dead_letter.table).to_pylist()


def dead_letter_ids(job, prefix: str) -> list[str]:
    rows = [r for r in dead_letters(job) if r["key"].decode().startswith(prefix)]
    return [r["id"] for r in sorted(rows, key=lambda r: r["key"])]


def copies_in_topic(bootstrap: str, topic: str, key: str) -> list[list[tuple[str, bytes]]]:
    """Headers of every committed record with `key` in `topic`."""
    return [m.headers() or [] for m in read_topic(bootstrap, topic) if m.key() == key.encode()]


def test_run_exits_0_and_logs_one_metrics_line_per_batch(job):
    _, _, code, _, err = job
    assert code == 0
    lines = logged_metrics(err)
    assert lines, err
    assert len({line["batch_id"] for line in lines}) == len(lines)
    totals = {
        name: sum(line[name] for line in lines)
        for name in ("records_main", "records_retry", "succeeded", "dead_lettered", "retried")
    }
    assert totals == {
        "records_main": 15,
        "records_retry": 0,
        "succeeded": 4,
        "dead_lettered": 8,
        "retried": 3,
    }
    assert [sum(t) for t in zip(*(line["retried_by_tier"] for line in lines), strict=True)] == [
        3,
        0,
    ]
    assert lines[-1]["input_lag"][job[1]] == {"lag": 0, "not_due": 0}


def test_secret_never_printed(job, capsys):
    assert SECRET not in job[3] + job[4]
    for args in (["status", str(job[0])], ["status", str(job[0]), "--json"]):
        code, out, err = run_cli(capsys, *args)
        assert code == 0
        assert SECRET not in out + err
    code, out, err = run_cli(capsys, "check", str(job[0]), "--show")
    assert code == 0, err
    assert SECRET not in out + err
    assert '"sasl.password": "***"' in out


def test_status_json_reports_tiers_dead_letters_and_batches(job, capsys):
    code, out, _ = run_cli(capsys, "status", str(job[0]), "--json")

    assert code == 0
    status = json.loads(out)
    assert set(status) == {
        "job",
        "generated_at",
        "checkpoint",
        "last_completed_batch",
        "broker",
        "main_topics",
        "retry_tiers",
        "delay_topics",
        "dead_letters",
        "breaker",
        "key_order",
        "last_batches",
    }
    assert status["delay_topics"] == []  # a delay router's
    assert status["breaker"] is None  # no [breaker]
    assert status["key_order"] is None  # no retry.key_ordered
    assert status["broker"]["reachable"] is True
    assert status["main_topics"] == [{"topic": job[1], "exists": True, "partitions": 2, "lag": 0}]
    first, second = status["retry_tiers"]
    assert (first["tier"], first["delay"], first["waiting"], first["due"]) == (1, "30m", 3, 0)
    assert first["exact"] is True
    assert 0 <= first["oldest_waiting_age_seconds"] < 600
    assert 1200 < first["next_due_in_seconds"] <= 1800
    assert (second["waiting"], second["next_due_at"]) == (0, None)
    classes = {c["error_class"]: c["records"] for c in status["dead_letters"]["by_error_class"]}
    assert classes == {"builtins.ValueError": 3, "retrylib.errors.NonRetryable": 5}
    dead = status["dead_letters"]
    assert (dead["waiting"], dead["looping"]) == (8, 0)
    assert 0 <= dead["oldest_waiting_age_seconds"] < 600
    batches = status["last_batches"]
    assert batches["source"] == "metrics_table"
    assert sum(b["records_main"] for b in batches["batches"]) == 15


def test_status_text_is_readable(job, capsys):
    code, out, _ = run_cli(capsys, "status", str(job[0]))

    assert code == 0
    assert "retry tiers" in out and "30m" in out and "in 2" in out  # next due in 2xm
    assert "builtins.ValueError" in out
    assert ", 0 redriven, 8 waiting (the oldest for " in out
    assert "last batches (from metrics table)" in out


def test_check_passes_for_the_job_config(job, capsys):
    code, out, err = run_cli(capsys, "check", str(job[0]))

    assert code == 0, err
    assert f"ok: main topic '{job[1]}': 2 partitions" in out
    assert "note: tables not checked" in out
    assert out.rstrip().endswith(": ok")


def test_check_tables_finds_the_job_tables(job, capsys):
    config = config_of(job)

    code, out, err = run_cli(capsys, "check", str(job[0]), "--tables")

    assert code == 0, err
    for key, table in (
        ("output.table", config.output.table),
        ("dead_letter.table", config.dead_letter.table),
        ("metrics.table", config.metrics.table),
    ):
        assert f"ok: {key}: Delta table {table}" in out


def latest_version(spark, path: str) -> int:
    return DeltaTable.forPath(spark, path).history(1).collect()[0].version


def test_redrive_dry_run_changes_nothing(job, spark, capsys, bootstrap_servers):
    config = config_of(job)
    chosen = dead_letter_ids(job, "stop-")[0]
    version = latest_version(spark, config.dead_letter.table)

    code, out, _ = run_cli(capsys, "redrive", str(job[0]), "--id", chosen, "--dry-run", "--json")

    assert code == 0
    report = json.loads(out)
    assert report["dry_run"] is True
    assert [row["id"] for row in report["selected"]] == [chosen]
    assert report["selected"][0]["redrive_topic"] == job[1]
    assert latest_version(spark, config.dead_letter.table) == version
    assert len(copies_in_topic(bootstrap_servers, job[1], "stop-0")) == 1


def test_redrive_sends_once_with_original_headers(job, capsys, bootstrap_servers):
    code, out, err = run_cli(
        capsys, "redrive", str(job[0]), "--error-class", "ValueError", "--json"
    )

    assert code == 0, err
    report = json.loads(out)
    assert report["sent"] == 3
    assert sorted(row["id"] for row in report["selected"]) == sorted(dead_letter_ids(job, "bad-"))
    for i in range(3):
        copies = copies_in_topic(bootstrap_servers, job[1], f"bad-{i}")
        assert len(copies) == 2  # the original and one redriven copy
        # retrylib.* headers dropped, the redrive counted
        assert copies[1] == [("trace", f"t-bad-{i}".encode()), ("retrylib.redrives", b"1")]
    redriven = [r for r in dead_letters(job) if r["key"].startswith(b"bad-")]
    assert all(r["redriven_at"] is not None and r["redrive_topic"] == job[1] for r in redriven)

    code, out, _ = run_cli(capsys, "redrive", str(job[0]), "--error-class", "ValueError", "--json")

    assert code == 0
    assert json.loads(out)["sent"] == 0
    assert len(copies_in_topic(bootstrap_servers, job[1], "bad-0")) == 2


def test_redrive_filters_by_time(job, capsys):
    code, out, _ = run_cli(
        capsys, "redrive", str(job[0]), "--until", "2000-01-01T00:00:00Z", "--dry-run", "--json"
    )
    assert code == 0
    assert json.loads(out)["selected"] == []

    code, out, _ = run_cli(
        capsys,
        "redrive",
        str(job[0]),
        "--since",
        "2000-01-01",
        "--error-class",
        "retrylib.errors.NonRetryable",
        "--dry-run",
        "--json",
    )
    assert code == 0
    selected = {row["id"] for row in json.loads(out)["selected"]}
    assert selected <= set(dead_letter_ids(job, "stop-")) and selected


class Crash(BaseException):
    """Stands for the process dying: nothing catches it, nothing is cleaned up."""


class MortalProducer:
    """The redrive's producer, with a way to die as the process around it would.

    `die()` sends what was produced and destroys the real producer at once, in this thread,
    then raises `Crash`. Otherwise the producer would live on in the traceback until the
    garbage collector frees it, at some later moment and after the resumed redrive has
    fenced it: not what a crash leaves behind.
    """

    made: list[MortalProducer] = []

    def __init__(self, producer):
        self._producer = producer
        MortalProducer.made.append(self)

    def __getattr__(self, name):
        return getattr(self._producer, name)

    def die(self, *_args):
        self._producer.flush(30)
        self._producer = None
        raise Crash()


@pytest.fixture
def mortal_producers(monkeypatch):
    """Redrives in the test make `MortalProducer`s; yields the list of those made."""
    real = redrive_module.make_producer
    MortalProducer.made = []
    monkeypatch.setattr(
        redrive_module, "make_producer", lambda *a, **k: MortalProducer(real(*a, **k))
    )
    yield MortalProducer.made
    monkeypatch.undo()


def test_redrive_crash_before_commit_is_resent_once(
    job, capsys, bootstrap_servers, monkeypatch, mortal_producers
):
    chosen = dead_letter_ids(job, "stop-")[1]

    # Records produced inside the transaction, then the process dies before committing.
    monkeypatch.setattr(MortalProducer, "commit_transaction", MortalProducer.die, raising=False)
    with pytest.raises(Crash):
        main(["redrive", str(job[0]), "--id", chosen])
    capsys.readouterr()
    row = next(r for r in dead_letters(job) if r["id"] == chosen)
    assert row["redrive_id"] is not None and row["redriven_at"] is None
    monkeypatch.delattr(MortalProducer, "commit_transaction")

    code, out, err = run_cli(capsys, "redrive", str(job[0]), "--id", chosen, "--json")

    assert code == 0, err
    report = json.loads(out)
    assert [r["id"] for r in report["resumed"]] == [chosen]
    assert report["sent"] == 1
    assert len(copies_in_topic(bootstrap_servers, job[1], "stop-1")) == 2
    row = next(r for r in dead_letters(job) if r["id"] == chosen)
    assert row["redriven_at"] is not None


def test_redrive_crash_after_commit_is_not_resent(
    job, capsys, bootstrap_servers, monkeypatch, mortal_producers
):
    chosen = dead_letter_ids(job, "stop-")[2]
    confirm = redrive_module._confirm

    def die(*args, **kwargs):
        mortal_producers[-1].die()

    monkeypatch.setattr(redrive_module, "_confirm", die)
    with pytest.raises(Crash):
        main(["redrive", str(job[0]), "--id", chosen])
    capsys.readouterr()
    monkeypatch.setattr(redrive_module, "_confirm", confirm)
    assert len(copies_in_topic(bootstrap_servers, job[1], "stop-2")) == 2

    code, out, err = run_cli(capsys, "redrive", str(job[0]), "--id", chosen, "--json")

    assert code == 0, err
    report = json.loads(out)
    assert [r["id"] for r in report["confirmed"]] == [chosen]
    assert report["sent"] == 0
    assert len(copies_in_topic(bootstrap_servers, job[1], "stop-2")) == 2
    row = next(r for r in dead_letters(job) if r["id"] == chosen)
    assert row["redriven_at"] is not None


def test_check_reports_a_missing_main_topic(capsys, bootstrap_servers, tmp_path, monkeypatch):
    path = job_config(tmp_path, bootstrap_servers, f"absent-{uuid.uuid4().hex[:8]}", "missing")
    monkeypatch.setenv(SECRET_VARIABLE, SECRET)

    code, out, err = run_cli(capsys, "check", str(path))

    assert code == 1
    assert "error: kafka.topics[0]: topic 'absent-" in err and "does not exist" in err
    assert "note: retry topic 'absent-" in out and "created when the job starts" in out


def test_check_notes_topics_the_job_would_create(
    capsys, bootstrap_servers, make_topic, tmp_path, monkeypatch
):
    topic = make_topic("fresh", partitions=1)
    path = job_config(tmp_path, bootstrap_servers, topic, "fresh")
    monkeypatch.setenv(SECRET_VARIABLE, SECRET)

    code, out, err = run_cli(capsys, "check", str(path), "--tables")

    assert code == 0, err
    assert (
        f"note: retry topic '{topic}.fresh.retry.30m' (tier 1, 30m, for '{topic}') does not exist"
        in out
    )
    assert f"note: dead-letter topic '{topic}.dlt' does not exist" in out
    assert f"note: output.table: no Delta table {tmp_path}/out; created on start" in out


def test_check_tables_names_column_differences(
    spark, capsys, bootstrap_servers, make_topic, tmp_path, monkeypatch
):
    path = job_config(tmp_path, bootstrap_servers, make_topic("other", partitions=1), "other")
    monkeypatch.setenv(SECRET_VARIABLE, SECRET)
    spark.createDataFrame([(1, "x")], "key INT, note STRING").write.format("delta").save(
        str(tmp_path / "out")
    )

    code, out, err = run_cli(capsys, "check", str(path), "--tables")

    assert code == 1
    assert f"error: output.table: the table {tmp_path}/out differs from the config: " in err
    assert "extra columns (in the table, not in the config): note STRING" in err
    assert "column key: table has INT, config has STRING" in err
    assert "point output.table at a new table or migrate this one" in err


@pytest.mark.parametrize(
    "through", ["classic", pytest.param("connect", marks=pytest.mark.every_spark)]
)
def test_status_and_redrive_as_a_process_of_their_own(job, bootstrap_servers, through, request):
    """`retrylib status`, `redrive` and `check --tables` as a user runs them: each process
    starts its own Spark (local[1]), or is a client of a Spark Connect server
    (`SPARK_REMOTE`), to read the tables; stdout carries only the JSON.
    """
    index = 3 if through == "classic" else 4
    chosen = dead_letter_ids(job, "stop-")[index]
    env = {}
    if through == "connect":
        env["SPARK_REMOTE"] = request.getfixturevalue("connect_server")

    status = run_retrylib("status", str(job[0]), "--json", env=env)
    redriven = run_retrylib("redrive", str(job[0]), "--id", chosen, "--json", env=env)
    checked = run_retrylib("check", str(job[0]), "--tables", env=env)

    assert checked.returncode == 0, checked.stderr[-3000:]
    dead_letter_table = config_of(job).dead_letter.table
    assert f"ok: dead_letter.table: Delta table {dead_letter_table}" in checked.stdout
    assert status.returncode == 0, status.stderr[-3000:]
    dead = json.loads(status.stdout)["dead_letters"]
    assert (dead["exists"], dead["total"]) == (True, 8)
    assert redriven.returncode == 0, redriven.stderr[-3000:]
    report = json.loads(redriven.stdout)
    assert (report["sent"], [row["id"] for row in report["selected"]]) == (1, [chosen])
    assert len(copies_in_topic(bootstrap_servers, job[1], f"stop-{index}")) == 2
    row = next(r for r in dead_letters(job) if r["id"] == chosen)
    assert row["redriven_at"] is not None and row["redrive_topic"] == job[1]
    outputs = status.stdout + status.stderr + redriven.stdout + redriven.stderr
    assert SECRET not in outputs
