"""`retrylib check` against a closed port, and as a user runs it, in a process of its own."""

from __future__ import annotations

import pytest
from helpers import run_retrylib, write_noop_job

from retrylib.ops.cli import EXIT_CONFIG, EXIT_OK, main

pytestmark = pytest.mark.usefixtures("keep_root_logger")


def test_a_closed_port_is_a_broker_not_reachable_within_the_timeout(tmp_path, capsys):
    path = write_noop_job(tmp_path, name="checked", bootstrap_servers="127.0.0.1:1")

    code = main(["check", str(path), "--timeout", "1"])

    captured = capsys.readouterr()
    assert code == EXIT_OK
    assert "warning: broker 127.0.0.1:1 not reachable within 1s" in captured.err
    assert captured.out.rstrip().endswith("ok (broker not checked)")


def test_check_as_a_user_runs_it_lists_each_late_failure_as_a_config_error(tmp_path):
    """`retrylib check` in a process of its own: problems that used to pass the check and
    fail or misbehave later are config errors (exit 2), each naming its key."""
    (tmp_path / "a-file").write_text("not a folder")
    (tmp_path / "other-file").write_text("not a folder")
    path = write_noop_job(
        tmp_path,
        name="checked",
        bootstrap_servers="127.0.0.1:1",
        output={"table": f"{tmp_path}/checkpoint/out"},
        kafka={
            "options": {
                "bootstrap.servers": "other:9092",
                "sasl.mechansim": "PLAIN",
                "client.id": "${env:}",
            }
        },
        dead_letter={"topic": "_retrylib.checked.produced", "table": f"{tmp_path}/a-file"},
        metrics={"table": f"{tmp_path}/other-file/metrics"},
        handler={"parallelism": 100000},
    )

    done = run_retrylib("check", str(path), "--timeout", "1", timeout=120)

    assert done.returncode == EXIT_CONFIG, done.stderr
    for key in (
        "kafka.options.bootstrap.servers: set by the job itself",
        "kafka.options.sasl.mechansim: No such configuration property",
        'kafka.options.client.id: "${env:}" is not a reference to an environment variable',
        'dead_letter.topic: "_retrylib.checked.produced" is the job\'s control topic',
        "output.table: ",
        f'dead_letter.table: "{tmp_path}/a-file" is a file; name a folder',
        f'metrics.table: "{tmp_path}/other-file/metrics" cannot be created: ',
        "handler.parallelism: at most 256",
    ):
        assert f"error: {key}" in done.stderr
    assert "is inside job.checkpoint" in done.stderr
    assert "invalid config (8 problems)" in done.stderr
    assert "Traceback" not in done.stderr
