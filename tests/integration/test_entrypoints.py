"""The job through its real entry points: spark-submit.sh, `retrylib run`, signals, topics."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from helpers import (
    assert_one_error_line,
    job_env,
    produce,
    read_table,
    read_table_rows,
    retrylib_command,
    run_cli,
    running_job,
    wait_for,
    wait_for_rows,
)

from retrylib.config.loader import load_config
from retrylib.config.model import Config
from retrylib.errors import TopicError
from retrylib.job import start_query

REPO = Path(__file__).resolve().parents[2]


def installed_example_handlers(workdir: Path) -> Path:
    """The example handler project (examples/) copied to `workdir`, built into a wheel and
    installed from it under a prefix, as a cluster installs a handler's wheel: the
    site-packages folder it went to."""
    project = workdir / "handler-project"
    shutil.copytree(REPO / "examples", project, ignore=shutil.ignore_patterns("__pycache__"))
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(workdir / "dist"), "."],
        cwd=project,
        check=True,
        timeout=120,
    )
    (wheel,) = (workdir / "dist").glob("orders_handlers-*.whl")
    prefix = workdir / "installed"
    subprocess.run(
        [*pip, "install", "--no-deps", "--prefix", str(prefix), str(wheel)], check=True, timeout=120
    )
    (site,) = prefix.glob("lib/python*/site-packages")
    return site


@pytest.mark.every_spark
def test_spark_submit_available_now_exits_zero(
    bootstrap_servers, make_topic, write_config, tmp_path
):
    """The handler comes from the example project's wheel, installed: not from handler.paths."""
    topic = make_topic("orders", partitions=2)
    orders = [
        {
            "order_id": f"o-{i}",
            "customer": "c-1",
            "currency": "EUR",
            "items": [{"sku": "a", "qty": 2, "price": i / 2}],
        }
        for i in range(200)
    ]
    produce(bootstrap_servers, topic, [(o["order_id"], json.dumps(o)) for o in orders])
    config = write_config(
        [topic],
        handler="orders_handlers.handlers:enrich_order",
        handler_options={
            "output_schema": "order_id STRING, customer STRING, total DOUBLE, currency STRING",
            "paths": ["."],  # the config's folder, which holds no handler
        },
    )
    site = installed_example_handlers(tmp_path)
    events = tmp_path / "spark-events"
    events.mkdir()
    event_log = (
        f"--conf spark.eventLog.enabled=true --conf spark.eventLog.dir=file://{events} "
        "--conf spark.eventLog.compress=false --conf spark.eventLog.rolling.enabled=false"
    )
    # The tests' class archive (SPARK_SUBMIT_OPTS, conftest) is used as it is: spark-submit.sh
    # makes none of its own (retrylib/dev/class_archive.py), which would have made this folder.
    own_archives = tmp_path / "class-archives"
    env = job_env(
        {
            "RETRYLIB_SPARK_EXTRA": f"--master local[2] {event_log}",
            "PYTHONPATH": str(site),
            "RETRYLIB_CLASS_ARCHIVE": str(own_archives),
        }
    )

    done = subprocess.run(
        [str(REPO / "spark-submit.sh"), config.source_path, "--available-now"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )

    assert done.returncode == 0, done.stderr[-3000:]
    output = read_table(config.output.table).to_pydict()
    totals = dict(zip(output["order_id"], output["total"], strict=True))
    assert totals == {o["order_id"]: float(i) for i, o in enumerate(orders)}
    # "auto" gives a new checkpoint retrylib's own reader. (spark-submit sends the Python
    # driver's stderr to its own stdout.) An installed handler is not shipped: every node
    # has it.
    log = done.stdout + done.stderr
    assert "topics read with the retrylib_kafka Python data source" in log
    assert "shipped" not in log
    # Each batch's counters reach Spark's listeners: the event log (what the History Server
    # shows) holds them in the progress events.
    observed = [
        event["progress"]["observedMetrics"]["retrylib"]
        for log_file in events.iterdir()
        for event in map(json.loads, log_file.read_text().splitlines())
        if event["Event"].endswith("StreamingQueryListener$QueryProgressEvent")
        and "retrylib" in event["progress"].get("observedMetrics", {})
    ]
    totals = [
        sum(dict(zip(names(m), m["values"], strict=True))[name] for m in observed)
        for name in ("records_main", "succeeded", "output_rows", "dead_lettered")
    ]
    assert totals == [200, 200, 200, 0]
    # `status` as an EMR step runs it (submit.sh): through spark-submit, its tables read in
    # spark-submit's session.
    status = subprocess.run(
        [str(REPO / "spark-submit.sh"), "status", config.source_path, "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert status.returncode == 0, status.stderr[-3000:]
    printed = status.stdout[status.stdout.index('{\n  "job"') :]
    state, _ = json.JSONDecoder().raw_decode(printed)
    assert state["broker"]["reachable"] and state["last_completed_batch"] is not None, state
    assert state["dead_letters"]["exists"] and state["dead_letters"]["total"] == 0, state
    assert not own_archives.exists()
    # What it shipped to the executors (and ran the driver from): the job without retrylib/dev/
    # (the embedded broker, the jar resolver and the demo).
    with zipfile.ZipFile(REPO / "build" / "retrylib-py.zip") as bundle:
        shipped = set(bundle.namelist())
    assert {
        "retrylib/batch/commit.py",
        "retrylib/task/routing.py",
        "retrylib/source/kafka_source.py",
    } <= shipped
    assert not [name for name in shipped if name.startswith("retrylib/dev/")]


def names(observed: dict) -> list[str]:
    """The field names of an observed-metrics row as Spark's event log writes it."""
    return [field["name"] for field in observed["schema"]["fields"]]


def test_sigterm_stops_after_the_batch_and_exits_zero(
    bootstrap_servers, make_topic, write_config, capsys, tmp_path
):
    """A running job: a second copy of it is refused at start, under the checkpoint's own
    spelling and under others of the same folder (through a symlink, with a trailing slash,
    as a `file:` URI), and the first goes on; SIGTERM then stops it after its batch."""
    topic = make_topic("orders", partitions=2)
    produce(bootstrap_servers, topic, [(f"ok-{i}", "v") for i in range(2000)])
    config = write_config([topic], kafka={"max_offsets_per_trigger": 50})  # a long backlog
    command = retrylib_command("run", config.source_path, "--master", "local[2]")
    log_path = tmp_path / "job.log"
    with running_job(command, job_env(), log_path) as job:
        table = config.output.table
        written = wait_for_rows(job, log_path, table, lambda rows: rows > 0, 180)
        (tmp_path / "link").symlink_to(tmp_path)
        for spelling in (
            config.job.checkpoint,
            f"{tmp_path}/link/checkpoint",
            f"{config.job.checkpoint}/",
            f"file://{tmp_path}/link/./checkpoint",
        ):
            copy = spelled_copy(config, tmp_path / "copies", spelling)
            code, _, err = run_cli(capsys, "run", str(copy))
            assert_one_error_line(
                code, err, "job 'itest': another copy holds the lease", f" pid={job.pid} since="
            )
        wait_for_rows(job, log_path, table, lambda rows: rows > written, 60)
        job.send_signal(signal.SIGTERM)
        job.wait(timeout=120)
    stderr = log_path.read_text()
    assert job.returncode == 0, stderr[-3000:]
    after_signal = stderr.split("stopping after the current batch", 1)[1]
    batches_after = set(re.findall(r'"batch_id": (\d+)', after_signal))
    # The batch running at the signal, and at most one that Spark starts while the stop
    # request travels to the stream thread.
    assert len(batches_after) <= 2, after_signal[-3000:]
    # A quiet stop: the batches' lines and one saying it stopped.
    assert "Traceback" not in after_signal and "Exception" not in after_signal, after_signal
    noise = [
        line
        for line in after_signal.splitlines()[1:]
        if "retrylib.metrics" not in line and "retrylib.batch.commit" not in line
    ]
    assert len(noise) == 1, "\n".join(noise)
    assert "; the next start goes on from there" in after_signal, after_signal[-3000:]
    assert read_table_rows(config.output.table) < 2000  # it stopped with a backlog left


def spelled_copy(config: Config, folder: Path, checkpoint: str) -> Path:
    """A copy of `config`'s file in `folder` that spells its checkpoint `checkpoint`."""
    source = Path(config.source_path)
    folder.mkdir(exist_ok=True)
    copy = folder / f"{len(list(folder.iterdir()))}-{source.name}"
    text = source.read_text()
    spelled = text.replace(f'"{config.job.checkpoint}"', json.dumps(checkpoint))
    assert spelled != text or checkpoint == config.job.checkpoint
    copy.write_text(spelled)
    return copy


def test_sigterm_while_a_handler_hangs_cancels_its_batch_at_the_stop_timeout(
    bootstrap_servers, make_topic, write_config, tmp_path, capsys
):
    """Past job.stop_timeout the batch running is cancelled, its hung task with it: exit 0,
    one line after the signal's (no traceback, no JVM stack overflow), and the next start
    runs the batch again, each record once."""
    topic = make_topic("orders", partitions=2)
    keys = ["stuck-0", *(f"ok-{i}" for i in range(20))]
    produce(bootstrap_servers, topic, [(key, "v") for key in keys])
    config = write_config([topic], job={"stop_timeout": "2s"})
    stuck = tmp_path / "stuck"
    stuck.touch()
    job = subprocess.Popen(
        retrylib_command("run", config.source_path, "--master", "local[2]"),
        env=job_env({"RETRYLIB_TEST_STUCK": str(stuck)}),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for((tmp_path / "stuck.started").exists, 180, "the stuck handler", job)
        job.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        _, stderr = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 0, stderr[-3000:]
    assert time.monotonic() - signalled < 45, "the stop took longer than its bound and Spark's"
    (stopped,) = stderr.split("stopping after the current batch\n", 1)[1].splitlines()
    assert "did not finish within 2s and runs again at the next start" in stopped, stopped
    assert read_table_rows(config.output.table) == 0  # the batch committed nothing

    stuck.unlink()
    code, _, err = run_cli(capsys, "run", config.source_path, "--available-now")
    assert code == 0, err[-3000:]
    output = read_table(config.output.table).column("key").to_pylist()
    assert sorted(output) == sorted(keys)


def test_sigterm_to_the_spark_submit_jvm_stops_after_the_batch_and_exits_zero(
    bootstrap_servers, make_topic, write_config, tmp_path
):
    """What a cluster manager does: SIGTERM to the JVM that spark-submit started, not to the
    Python driver (its child), which never gets a signal of its own."""
    topic = make_topic("orders", partitions=2)
    produce(bootstrap_servers, topic, [(f"ok-{i}", "v") for i in range(2000)])
    config = write_config([topic], kafka={"max_offsets_per_trigger": 50})  # a long backlog
    env = job_env({"RETRYLIB_SPARK_EXTRA": "--master local[2]"})
    log_path = tmp_path / "job.log"
    with running_job([str(REPO / "spark-submit.sh"), config.source_path], env, log_path) as job:
        wait_for_rows(job, log_path, config.output.table, lambda rows: rows > 0, 240)
        # spark-submit.sh execs spark-submit, which execs the JVM: this pid is the JVM.
        command = Path(f"/proc/{job.pid}/cmdline").read_bytes().split(b"\0")
        assert b"org.apache.spark.deploy.SparkSubmit" in command, command
        job.send_signal(signal.SIGTERM)
        job.wait(timeout=180)
    output = log_path.read_text()
    assert job.returncode == 0, output[-3000:]
    after_signal = output.split("stopping after the current batch", 1)[1]
    batches_after = set(re.findall(r'"batch_id": (\d+)', after_signal))
    assert len(batches_after) <= 2, after_signal[-3000:]
    # Every batch that wrote rows finished and logged them: none was cut off mid-way.
    lines = [
        json.loads(line[line.index("{") :]) for line in output.splitlines() if '"batch_id"' in line
    ]
    logged = {line["batch_id"]: line.get("output_rows", 0) for line in lines}
    assert read_table_rows(config.output.table) == sum(logged.values()) < 2000


@pytest.mark.every_spark
def test_missing_topics_fail_at_start_when_creation_is_off(
    spark, bootstrap_servers, make_topic, write_config
):
    topic = make_topic("orders", partitions=1)
    written = write_config([topic], name="nocreate")
    config = load_config(written.source_path, overrides={"kafka.create_topics": False})

    with pytest.raises(TopicError, match=re.escape(config.retry.tier_topics()[0])):
        start_query(spark, config, available_now=True)


def test_spark_submit_refuses_the_former_name_of_its_extra_flags_variable() -> None:
    """Its flags (say --master yarn) would be dropped in silence, and the job run elsewhere."""
    env = job_env({"SPARK_SUBMIT_OPTS_EXTRA": "--master yarn"})
    done = subprocess.run(
        [str(REPO / "spark-submit.sh"), str(REPO / "conf" / "orders.toml")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "SPARK_SUBMIT_OPTS_EXTRA is now called RETRYLIB_SPARK_EXTRA" in done.stderr


@pytest.mark.parametrize("entry", ["spark-submit.sh", "retrylib"])
def test_a_malformed_spark_setting_stops_each_entry_point_with_one_line(entry) -> None:
    """`RETRYLIB_SPARK_CONF` is read alike by spark-submit.sh and `retrylib`: an entry that is
    no Spark setting stops either before Spark starts, naming it."""
    config = str(REPO / "conf" / "orders.toml")
    command = [str(REPO / "spark-submit.sh"), config]
    if entry == "retrylib":
        command = retrylib_command("status", config)
    env = job_env({"RETRYLIB_SPARK_CONF": "spark.ok=1 fs.s3a.endpoint=http://x"})
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert "RETRYLIB_SPARK_CONF: 'fs.s3a.endpoint=http://x' is not a Spark setting" in done.stderr
