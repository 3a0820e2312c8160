"""The Spark Connect questions that retrylib/job and batch/commit.py still ask by these names;
each answer comes from the session's flavour (`retrylib.spark.flavour`). This module goes
once they ask `flavour_of(spark)` themselves."""

from __future__ import annotations

from typing import TYPE_CHECKING

from retrylib.spark.flavour import flavour_of
from retrylib.spark.flavour.connect import Connect

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def is_connect(spark: SparkSession) -> bool:
    """Whether `spark` is a Spark Connect session."""
    return isinstance(flavour_of(spark), Connect)


def default_parallelism(spark: SparkSession) -> int:
    """`Flavour.default_parallelism`."""
    return flavour_of(spark).default_parallelism(spark)


def set_job_property(spark: SparkSession, key: str, value: str | None) -> None:
    """`Flavour.set_job_property`."""
    flavour_of(spark).set_job_property(spark, key, value)
