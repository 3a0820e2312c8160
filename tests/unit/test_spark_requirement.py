"""The Spark a driver must run (retrylib.spark.requirement), and the commands that ask."""

from __future__ import annotations

import pytest

from retrylib.ops import cli
from retrylib.spark.requirement import spark_version_problem


@pytest.mark.parametrize("version", ["4.0.0", "4.0.2-amzn-0", "4.1.1", "4.2.0.dev1", "5.0.0"])
def test_spark_4_0_and_newer_runs(version):
    assert spark_version_problem(version) is None


@pytest.mark.parametrize("version", ["3.5.1", "3.5.2-amzn-1", "3.3.0", "2.4.8"])
def test_an_older_spark_is_refused_in_one_line_naming_the_version_needed(version):
    problem = spark_version_problem(version)
    assert problem is not None and "\n" not in problem
    assert problem.startswith(
        f"retrylib needs Spark 4.0 or newer; this driver's pyspark is {version}"
    )
    assert "emr-spark-8.0.0" in problem


def test_a_version_that_says_no_major_and_minor_is_let_through():
    assert spark_version_problem("") is None
    assert spark_version_problem("unknown") is None


def test_no_pyspark_is_refused_naming_what_to_install():
    problem = spark_version_problem(None)
    assert problem is not None and "\n" not in problem
    assert "Spark 4.0 or newer" in problem and "retrylib[spark]" in problem


@pytest.mark.parametrize(
    ("argv", "uses_spark"),
    [
        (["run", "c.toml"], True),
        (["status", "c.toml"], True),
        (["redrive", "c.toml", "--dry-run"], True),
        (["demo"], True),
        (["check", "c.toml", "--tables"], True),
        (["check", "c.toml"], False),
        (["check", "c.toml", "--offline"], False),
    ],
)
def test_the_commands_that_start_or_join_spark_ask(argv, uses_spark):
    assert cli._uses_spark(cli._parser().parse_args(argv)) is uses_spark


def test_run_on_an_old_spark_ends_with_exit_code_2_before_the_config_is_read(monkeypatch, capsys):
    monkeypatch.setattr("retrylib.spark.requirement.driver_pyspark_version", lambda: "3.5.1")
    assert cli.main(["run", "no-such-config.toml"]) == cli.EXIT_CONFIG
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: retrylib needs Spark 4.0 or newer")
