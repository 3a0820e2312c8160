"""Whether a second driver may write a job's table beside it: the rule `redrive` and `check`
share."""

from __future__ import annotations

import pytest

from retrylib.config.table_ref import TableRef
from retrylib.sinks.log_store import single_driver_only

DYNAMODB = "io.delta.storage.S3DynamoDBLogStore"


def refusal(location: str, settings: dict[str, str], environ: dict[str, str] | None = None):
    table = TableRef.parse(location, "dead_letter.table")
    return single_driver_only(table, settings.get, environ or {})


@pytest.mark.parametrize("scheme", ["s3", "s3a", "S3A", "s3n"])
def test_a_table_on_s3_with_delta_s_default_log_store_is_refused_naming_the_setting(scheme):
    line = refusal(f"{scheme}://bucket/dlq", {})
    key = f"spark.delta.logStore.{scheme.lower()}.impl"
    assert line is not None and "\n" not in line
    assert f"{key}=io.delta.storage.S3DynamoDBLogStore" in line, line
    assert refusal(f"{scheme}://bucket/dlq", {key: DYNAMODB}) is None


def test_a_single_driver_store_named_outright_is_refused_too():
    key = "spark.delta.logStore.s3a.impl"
    line = refusal("s3a://b/dlq", {key: "io.delta.storage.S3SingleDriverLogStore"})
    assert line is not None and "S3SingleDriverLogStore" in line
    assert refusal("s3a://b/dlq", {"spark.delta.logStore.class": DYNAMODB}) is None


@pytest.mark.parametrize(
    "location",
    ["/data/dlq", "hdfs://nn:8020/dlq", "abfss://c@a.dfs.core.windows.net/dlq", "db.dlq"],
)
def test_tables_elsewhere_and_catalog_names_are_not_asked(location):
    assert refusal(location, {}) is None


def test_databricks_commits_to_s3_through_its_own_service():
    assert refusal("s3://b/dlq", {}, {"DATABRICKS_RUNTIME_VERSION": "17.3"}) is None
