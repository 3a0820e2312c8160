"""The executors' Python workers started, and the task modules imported in them, while a
job's query starts.

A batch's tasks run in Python workers, which Spark forks from its daemon on first use and
then keeps for the next tasks (`spark.python.worker.reuse`, on by default). A new worker
spends a second or more of CPU before its first record: it imports pyarrow, the Kafka
client and retrylib's task modules as it unpickles its function. Left to the first batch,
that comes after the query's first plan, in the batch's critical path. Started with the
query instead, one task per core, it overlaps the query's start and the tables being made.
The job imports no user code: the handler module is imported by the tasks that call it.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql import SparkSession

from retrylib.batch.at_once import Started

log = logging.getLogger(__name__)

TASK_MODULES = (
    "retrylib.batch.routing_stage",  # the routing tasks' function: a handler job's or a router's
    "retrylib.task.routing",
    "retrylib.task.forwarding",
    "retrylib.source.kafka_source",  # the retrylib_kafka source's reads
    "retrylib.sinks.produce_units",  # the produce tasks
)
"""The modules of the functions a job's tasks run, which a worker imports as it unpickles
them."""
DESCRIPTION = "retrylib: start the executors' Python workers"


def start_python_workers(spark: SparkSession, tasks: int) -> Started:
    """Start, in a thread, a Spark job of `tasks` tasks that import `TASK_MODULES` in the
    Python workers they run in. Its result is the number of tasks that ran; a failure is
    logged (at debug: the batches start their own workers) and is its result's error."""
    return Started(spark, lambda: _run(spark, tasks))


def _run(spark: SparkSession, tasks: int) -> int:
    context = spark.sparkContext
    context.setJobDescription(DESCRIPTION)
    try:
        rows = spark.range(tasks, numPartitions=tasks).mapInArrow(_import_task_modules, "id LONG")
        return rows.count()
    except Exception as error:
        log.debug("starting the Python workers ahead of the first batch failed: %s", error)
        raise
    finally:
        context.setJobDescription(None)  # type: ignore[arg-type]


def _import_task_modules(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for name in TASK_MODULES:
        importlib.import_module(name)
    yield from batches
