"""Whether a second driver may write a Delta table beside the job: one rule, for `redrive`
(which then writes only while the job is stopped) and `check --tables` (which says so).

Delta commits a table's version N by creating `_delta_log/<N>.json` only if absent. On S3
open-source Delta's default log store (`S3SingleDriverLogStore`) can promise that only
within one driver (S3 has no create-if-absent it uses), so two drivers committing at once
can both write version N and one commit is lost. The job appends its dead letters while
`retrylib redrive` (on EMR, a step of its own: a second driver) updates the same table. A
log store made for several writers, `io.delta.storage.S3DynamoDBLogStore` (the jar
`io.delta:delta-storage-s3-dynamodb`), takes each version in a DynamoDB table first, so every
driver writing the table must set it: `spark.delta.logStore.<scheme>.impl`. Databricks
commits to S3 through its own service, safe for several writers: nothing is asked there.

Pure but for `spark_setting`: the rule takes how to read a Spark setting.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from retrylib.config.table_ref import TableRef

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

S3_SCHEMES = frozenset({"s3", "s3a", "s3n"})
MULTI_WRITER_LOG_STORES = frozenset({"io.delta.storage.S3DynamoDBLogStore"})
"""Delta log stores whose commits stay one per version with several writing drivers on S3."""
_LEGACY_KEY = "spark.delta.logStore.class"  # Delta's older single setting for every scheme


def spark_setting(spark: SparkSession) -> Callable[[str], str | None]:
    """How `second_writer_refusal` reads `spark`'s settings (classic or Spark Connect)."""
    return lambda key: spark.conf.get(key, None)


def log_store_key(scheme: str) -> str:
    """The Spark setting naming Delta's log store for tables under `scheme`."""
    return f"spark.delta.logStore.{scheme}.impl"


def single_driver_only(
    table: TableRef,
    setting: Callable[[str], str | None],
    environ: Mapping[str, str] = os.environ,
) -> str | None:
    """Why only one driver at a time may write `table`, with the setting that would let
    several, in one clause; or None when several may: a table not on S3, a catalog name (its
    location is the catalog's), Databricks, or a multi-writer log store set. `setting` reads
    a Spark setting (None when unset)."""
    if not table.is_path or environ.get("DATABRICKS_RUNTIME_VERSION"):
        return None
    scheme = table.text.split(":", 1)[0].lower()
    if ":" not in table.text or scheme not in S3_SCHEMES:
        return None
    key = log_store_key(scheme)
    store = setting(key) or setting(_LEGACY_KEY)
    if store in MULTI_WRITER_LOG_STORES:
        return None
    return (
        f"{table.text} is on S3, where Delta's log store ({store or 'the default'}) keeps "
        "commits apart within one driver only (set "
        f"{key}=io.delta.storage.S3DynamoDBLogStore, jar io.delta:delta-storage-s3-dynamodb, "
        "for every driver that writes it: docs/deploy.md)"
    )
