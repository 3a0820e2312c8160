"""The user's jars and Spark settings for every entry point (`retrylib/spark/extra.py`)."""

from __future__ import annotations

import pytest

from retrylib.errors import ConfigError
from retrylib.spark.extra import extra_conf, extra_jars, main, submit_arguments

S3A = {
    "RETRYLIB_SPARK_CONF": "spark.hadoop.fs.s3a.endpoint=http://127.0.0.1:9000\n"
    "  spark.hadoop.fs.s3a.path.style.access=true",
}


def test_jars_are_comma_separated_and_blanks_ignored():
    assert extra_jars({"RETRYLIB_SPARK_JARS": " /a.jar, ,/b.jar,"}) == ["/a.jar", "/b.jar"]
    assert extra_jars({}) == []


def test_settings_split_at_any_white_space_and_keep_equals_signs_in_values():
    conf = extra_conf({"RETRYLIB_SPARK_CONF": f"{S3A['RETRYLIB_SPARK_CONF']} spark.x=a=b"})
    assert conf == {
        "spark.hadoop.fs.s3a.endpoint": "http://127.0.0.1:9000",
        "spark.hadoop.fs.s3a.path.style.access": "true",
        "spark.x": "a=b",
    }


@pytest.mark.parametrize("entry", ["fs.s3a.endpoint=x", "spark.a", "spark.a=", "=x"])
def test_an_entry_that_is_not_a_spark_setting_is_refused_naming_it(entry):
    with pytest.raises(ConfigError, match=rf"RETRYLIB_SPARK_CONF: '{entry}' is not a Spark"):
        extra_conf({"RETRYLIB_SPARK_CONF": f"spark.ok=1 {entry}"})


def test_one_jars_flag_holds_the_scripts_the_users_and_those_of_the_free_form_flags():
    environ = {
        **S3A,
        "RETRYLIB_SPARK_JARS": "/s3a.jar,/own.jar",
        "RETRYLIB_SPARK_EXTRA": "--master yarn --jars /x.jar,/y.jar --jars=/z.jar",
    }
    assert submit_arguments("/own.jar,/delta.jar", environ) == [
        "--jars",
        "/own.jar,/delta.jar,/x.jar,/y.jar,/z.jar,/s3a.jar",
        "--conf",
        "spark.hadoop.fs.s3a.endpoint=http://127.0.0.1:9000",
        "--conf",
        "spark.hadoop.fs.s3a.path.style.access=true",
    ]
    assert submit_arguments("", {}) == []


def test_the_rest_of_the_free_form_flags_is_printed_without_their_jars(monkeypatch, capsys):
    monkeypatch.setenv("RETRYLIB_SPARK_EXTRA", "--master local[2] --jars /x.jar --driver-memory 1g")
    assert main(["--rest"]) == 0
    assert capsys.readouterr().out.split() == ["--master", "local[2]", "--driver-memory", "1g"]


def test_a_bad_setting_stops_the_script_with_one_line(monkeypatch, capsys):
    monkeypatch.setenv("RETRYLIB_SPARK_CONF", "oops")
    assert main(["/own.jar"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "RETRYLIB_SPARK_CONF: 'oops'" in err
