"""`retrylib check` without a broker: every config problem at once, and an unreachable broker."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from retrylib.ops.cli import EXIT_CONFIG, EXIT_FAILED, EXIT_OK, main


@pytest.fixture(autouse=True)
def keep_root_logger():
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "handlers_for_check.py").write_text("def handle(record):\n    return None\n")
    path = tmp_path / "job.toml"
    path.write_text(text.replace("TMP", str(tmp_path)))
    return path


VALID = """
[job]
name = "checked"
checkpoint = "TMP/checkpoint"
[kafka]
bootstrap_servers = "127.0.0.1:1"
topics = ["orders"]
[handler]
function = "handlers_for_check:handle"
output_schema = "id STRING"
paths = ["TMP"]
[output]
table = "TMP/out"
"""


def test_every_config_problem_is_listed_with_its_key(tmp_path, capsys):
    path = write(
        tmp_path,
        VALID.replace('topics = ["orders"]', 'topics = ["orders"]\ntopcs = 1').replace(
            'name = "checked"', 'name = "bad name!"'
        )
        + '[retry]\ndelays = ["5s", "soon"]\nmax_attempts = 0\n',
    )

    code = main(["check", str(path)])

    err = capsys.readouterr().err
    assert code == EXIT_CONFIG
    for key in ("job.name", "kafka.topcs", "retry.delays[1]", "retry.max_attempts"):
        assert f"error: {key}: " in err
    assert "invalid config (4 problems)" in err


def test_an_unreachable_broker_is_a_warning(tmp_path, capsys):
    path = write(tmp_path, VALID)

    code = main(["check", str(path), "--timeout", "1"])

    captured = capsys.readouterr()
    assert code == EXIT_OK
    assert "warning: broker 127.0.0.1:1 not reachable within 1s" in captured.err
    assert "topics not checked" in captured.err
    assert captured.out.rstrip().endswith("ok (broker not checked)")


def test_an_unreachable_broker_fails_when_required(tmp_path, capsys):
    path = write(tmp_path, VALID)

    code = main(["check", str(path), "--timeout", "1", "--require-broker"])

    assert code == EXIT_FAILED
    assert "--require-broker" in capsys.readouterr().err


def test_show_prints_the_config_with_secrets_masked(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CHECK_TEST_TOKEN", "tok-7f3a9")
    path = write(
        tmp_path,
        VALID.replace(
            'topics = ["orders"]',
            'topics = ["orders"]\n[kafka.options]\n'
            '"sasl.oauthbearer.config" = "x=${env:CHECK_TEST_TOKEN}"\n'
            '"client.id" = "visible"',
        ),
    )

    code = main(["check", str(path), "--timeout", "1", "--show"])

    captured = capsys.readouterr()
    assert code == EXIT_OK
    assert '"client.id": "visible"' in captured.out
    assert '"sasl.oauthbearer.config": "***"' in captured.out
    assert "tok-7f3a9" not in captured.out + captured.err


def test_tables_are_not_checked_without_the_flag(tmp_path, capsys, monkeypatch):
    import retrylib.ops.check as check_module

    def no_spark(app_name):
        raise AssertionError("check started Spark without --tables")

    monkeypatch.setattr(check_module, "tool_session", no_spark)
    path = write(tmp_path, VALID)

    code = main(["check", str(path), "--timeout", "1"])

    assert code == EXIT_OK
    assert "note: tables not checked (--tables checks them with Spark)" in capsys.readouterr().out


def test_tables_flag_reports_the_table_findings(tmp_path, capsys, monkeypatch):
    import retrylib.ops.check as check_module
    from retrylib.ops.check import Finding

    sessions = []
    monkeypatch.setattr(check_module, "tool_session", lambda name: sessions.append(name) or name)
    monkeypatch.setattr(
        check_module,
        "_table_findings",
        lambda spark, config: [Finding("error", f"output.table: differs (read with {spark})")],
    )
    path = write(tmp_path, VALID)

    code = main(["check", str(path), "--timeout", "1", "--tables"])

    err = capsys.readouterr().err
    assert code == EXIT_FAILED
    assert sessions == ["retrylib-check-checked"]
    assert "error: output.table: differs (read with retrylib-check-checked)" in err


def test_an_unknown_kafka_option_is_a_config_error_naming_it(tmp_path, capsys):
    path = write(tmp_path, VALID + '[kafka.options]\n"sasl.mechansim" = "PLAIN"\n')

    code = main(["check", str(path), "--timeout", "1"])

    err = capsys.readouterr().err
    assert code == EXIT_CONFIG
    assert (
        'error: kafka.options.sasl.mechansim: No such configuration property: "sasl.mechansim"'
        in err
    )
    assert "is the broker up?" not in err


def test_bootstrap_servers_in_kafka_options_is_a_config_error(tmp_path, capsys):
    path = write(tmp_path, VALID + '[kafka.options]\n"bootstrap.servers" = "other:9092"\n')

    code = main(["check", str(path), "--timeout", "1"])

    assert code == EXIT_CONFIG
    assert (
        "error: kafka.options.bootstrap.servers: set by the job itself" in capsys.readouterr().err
    )


def test_check_as_a_user_runs_it_lists_each_late_failure_as_a_config_error(tmp_path):
    """`retrylib check` in a process of its own: problems that used to pass the check and
    fail or misbehave later are config errors (exit 2), each naming its key."""
    path = write(
        tmp_path,
        VALID.replace('table = "TMP/out"', 'table = "TMP/checkpoint/out"')
        + '[kafka.options]\n"bootstrap.servers" = "other:9092"\n"sasl.mechansim" = "PLAIN"\n'
        + '"client.id" = "${env:}"\n'
        + '[dead_letter]\ntopic = "_retrylib.checked.produced"\ntable = "TMP/dlq"\n',
    )

    done = subprocess.run(
        [sys.executable, "-m", "retrylib", "check", str(path), "--timeout", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert done.returncode == EXIT_CONFIG, done.stderr
    for key in (
        "kafka.options.bootstrap.servers: set by the job itself",
        "kafka.options.sasl.mechansim: No such configuration property",
        'kafka.options.client.id: "${env:}" is not a reference to an environment variable',
        'dead_letter.topic: "_retrylib.checked.produced" is the job\'s control topic',
        "output.table: ",
    ):
        assert f"error: {key}" in done.stderr
    assert "is inside job.checkpoint" in done.stderr
    assert "invalid config (5 problems)" in done.stderr
    assert "Traceback" not in done.stderr


def test_status_warns_of_a_tier_whose_records_are_long_overdue() -> None:
    from retrylib.ops.render import overdue_tiers

    def tier(due_in: float | None) -> dict:
        return {"tier": 1, "delay": "10s", "delay_seconds": 10.0, "next_due_in_seconds": due_in}

    assert overdue_tiers([tier(None), tier(5.0), tier(-60.0)]) == []
    [warning] = overdue_tiers([tier(-3600.0)])
    assert warning.startswith("tier 1 (10s) has records due for 1h that the job has not taken")
