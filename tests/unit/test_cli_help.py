"""The `retrylib` command's help and usage errors: every subcommand documents its exit codes."""

from __future__ import annotations

import pytest

from retrylib.batch.spark_errors import spark_error_line
from retrylib.ops.cli import EXIT_CONFIG, EXIT_OK, main, script_main

COMMANDS = ("run", "check", "status", "redrive", "demo")


@pytest.mark.parametrize("command", [*COMMANDS, None])
def test_help_lists_exit_codes(command, capsys):
    code = main([command, "--help"] if command else ["--help"])

    out = capsys.readouterr().out
    assert code == EXIT_OK
    assert "exit codes:" in out
    assert "2  bad usage or invalid config" in out


@pytest.mark.parametrize(
    ("arguments", "usage"),
    [
        (["--help"], "usage: retrylib run "),  # CONF [--available-now]: the job
        (["status", "--help"], "usage: retrylib status "),
        (["redrive", "--help"], "usage: retrylib redrive "),
    ],
)
def test_a_cluster_s_entry_script_runs_the_job_unless_it_names_a_tool(arguments, usage, capsys):
    """jobs/run_job.py (an EMR step) and the Databricks task's run_job.py."""
    assert script_main(arguments) == EXIT_OK
    assert capsys.readouterr().out.startswith(usage)


def test_top_level_help_names_every_command(capsys):
    main(["--help"])

    out = capsys.readouterr().out
    for command in COMMANDS:
        assert f"    {command} " in out


@pytest.mark.parametrize(
    "argv, message",
    [
        ([], "the following arguments are required: COMMAND"),
        (["status"], "the following arguments are required: config"),
        (["redrive", "x.toml", "--since", "yesterday"], "expected an ISO 8601 time"),
        (["check", "x.toml", "--timeout", "0"], "expected a number of seconds above 0"),
        (["launch"], "invalid choice: 'launch'"),
    ],
)
def test_usage_errors_exit_2(argv, message, capsys):
    code = main(argv)

    assert code == EXIT_CONFIG
    assert message in capsys.readouterr().err


def test_a_missing_config_file_exits_2(capsys, tmp_path):
    code = main(["status", str(tmp_path / "nope.toml")])

    assert code == EXIT_CONFIG
    assert "no such file" in capsys.readouterr().err


def test_a_spark_error_from_python_code_is_one_line_with_what_python_raised() -> None:
    text = (
        "[STREAM_FAILED] Query [id = 1] terminated with exception: "
        "[PYTHON_STREAMING_DATA_SOURCE_RUNTIME_ERROR] Failed when Python streaming data source "
        "perform reportLatestOffset: Traceback (most recent call last):\n"
        '  File "/x/source.py", line 9, in reportLatestOffset\n'
        "    _, end = self._available(self._last_end or {})\n"
        "             ^^^^^^^^^^^^^^^\n"
        "retrylib.source.kafka_source.TopicVanished: listing offsets of ['t'] failed\n"
        "\tat org.apache.spark.sql.execution.python.streaming.Runner.x(Runner.scala:1)\n"
    )

    assert spark_error_line(text) == (
        "[STREAM_FAILED] Query [id = 1] terminated with exception: "
        "[PYTHON_STREAMING_DATA_SOURCE_RUNTIME_ERROR] Failed when Python streaming data source "
        "perform reportLatestOffset: retrylib.source.kafka_source.TopicVanished: "
        "listing offsets of ['t'] failed"
    )
    assert spark_error_line("[DELTA_X] no table\nmore") == "[DELTA_X] no table"
