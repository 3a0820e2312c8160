"""Producing a batch's outgoing records from the executors, in units, each exactly once.

The routing tasks stamp every result row with the task's partition (`unit`) and its place
in the task's output (`seq`, see `results.placed`), and Spark writes them to the batch's
staging folder. Once the batch's manifest is claimed, the driver runs one Spark job over the
outgoing records (`produce_units`):

    staging folder (Parquet) -> the outgoing records -> a partition per unit -> in unit
    order -> one Kafka transaction per unit (`kafka.transactional_producer`) -> one row per
    unit back

A unit is the outgoing records of one routing task, so what a unit holds is fixed by the
staging folder: every attempt of a unit's task, and every replay of the batch, produces the same
records under the same transactional id and marker. The units are spread over the job's
partitions one to a partition (`spread_keys`), so the work is as parallel as the routing
was. The driver gets back one row per unit (its count, and the Kafka clients opened),
never a record.

Each task first writes its rows to a local Arrow file (the worker's temporary directory),
then produces each unit from it: a failed transaction is produced again from the file, and
Spark's shuffle read does not count against the transaction's timeout. A Python worker keeps
its producers, one per unit id it served, across tasks and batches (`worker_clients.Pool`).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from retrylib.kafka.worker_clients import MAX_PRODUCERS, Pool, opened
from retrylib.logs import configure_worker_logging
from retrylib.sinks.outgoing_records import OUTGOING_SCHEMA
from retrylib.sinks.transactional_producer import UnitProducer, transactional_id
from retrylib.task.results import OUTGOING_KIND

UNIT_RESULT_SCHEMA = pa.schema(
    [
        pa.field("unit", pa.int32(), nullable=False),
        pa.field("produced", pa.int64(), nullable=False),
        pa.field("clients_opened", pa.int64(), nullable=False),
    ]
)


@dataclass(frozen=True)
class ProducePlan:
    """What the produce tasks of one batch need, built on the driver: the job's part once,
    the batch's (from `batch_id` on) set for each batch from its manifest."""

    job: str
    app_id: str
    bootstrap_servers: str
    options: Mapping[str, str]  # the producers'
    reader_options: Mapping[str, str]  # the consumer's that looks for markers
    signing_key: bytes
    secret_options: tuple[str, ...] = ()
    batch_id: int = -1
    units: int = 1  # the routing tasks' partitions: unit ids are below it
    control_from: int = 0  # the control topic's end before the batch's first produce
    topic_max_bytes: Mapping[str, int] = field(default_factory=dict)


def produce_units(decisions: DataFrame, plan: ProducePlan) -> tuple[int, int]:
    """Produce the outgoing records among `decisions` (a batch's staging folder, read by
    Spark) in units, each once; returns (records produced, Kafka clients the tasks opened).

    Raises what Spark raises when a task fails for good (its error names the cause).
    """
    keys = F.array(*(F.lit(key) for key in spread_keys(plan.units)))
    records = (
        decisions.where(f"kind = '{OUTGOING_KIND}'")
        .select("unit", "seq", f"{OUTGOING_KIND}.*")
        .withColumn("spread", F.element_at(keys, F.col("unit") + 1))
        .repartition(plan.units, "spread")
        .sortWithinPartitions("unit", "seq")
        .drop("spread")
    )
    schema = from_arrow_schema(UNIT_RESULT_SCHEMA)
    rows = records.mapInArrow(lambda batches: _produce_task(plan, batches), schema).collect()
    return sum(row["produced"] for row in rows), sum(row["clients_opened"] for row in rows)


# -- spreading the units over partitions ----------------------------------------------------

_MASK = 0xFFFFFFFF


def _rotate_left(value: int, bits: int) -> int:
    return ((value << bits) | (value >> (32 - bits))) & _MASK


def spark_hash_int(value: int, seed: int = 42) -> int:
    """Spark's `hash()` of an int column: Murmur3 x86 32-bit of 4 bytes, seed 42, signed.

    Spark places a row of `repartition(n, column)` in partition pmod(this, n).
    """
    k1 = (value & _MASK) * 0xCC9E2D51 & _MASK
    k1 = _rotate_left(k1, 15) * 0x1B873593 & _MASK
    h1 = _rotate_left(seed ^ k1, 13)
    h1 = (h1 * 5 + 0xE6546B64) & _MASK
    h1 ^= 4
    h1 ^= h1 >> 16
    h1 = h1 * 0x85EBCA6B & _MASK
    h1 ^= h1 >> 13
    h1 = h1 * 0xC2B2AE35 & _MASK
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 >= 1 << 31 else h1


def spread_keys(units: int) -> list[int]:
    """For each unit, a key that `repartition(units, key)` places in that unit's partition,
    so that no two units share a task."""
    keys: dict[int, int] = {}
    candidate = 0
    while len(keys) < units:
        keys.setdefault(spark_hash_int(candidate) % units, candidate)
        candidate += 1
    return [keys[unit] for unit in range(units)]


# -- the executor side ----------------------------------------------------------------------

_producers: Pool[UnitProducer] = Pool(MAX_PRODUCERS, lambda producer: producer.close())


def _produce_task(plan: ProducePlan, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The `mapInArrow` body: spool this partition's rows (in unit order) to a local file,
    then produce each unit from it; yields one `UNIT_RESULT_SCHEMA` row per unit."""
    configure_worker_logging()
    with tempfile.TemporaryDirectory(prefix="retrylib-produce-", dir=_local_dir()) as folder:
        for unit, path in _spool_units(batches, folder):
            before = opened()
            produced = _produce_unit(plan, unit, path)
            os.unlink(path)
            yield pa.RecordBatch.from_pylist(
                [{"unit": unit, "produced": produced, "clients_opened": opened() - before}],
                schema=UNIT_RESULT_SCHEMA,
            )


def _local_dir() -> str | None:
    """Spark's local directory for scratch files on this executor, if it names one."""
    dirs = os.environ.get("SPARK_LOCAL_DIRS")
    return dirs.split(",")[0] if dirs else None


def _spool_units(batches: Iterator[pa.RecordBatch], folder: str) -> Iterator[tuple[int, str]]:
    """Write each unit's rows (`OUTGOING_SCHEMA` columns, in order) to a file of its own in
    `folder`; yields (unit, path) once a unit's file is complete."""
    unit: int | None = None
    writer: pa.ipc.RecordBatchStreamWriter | None = None
    path = ""
    try:
        for batch in batches:
            for current, part in _runs(batch):
                if current != unit:
                    if writer is not None:
                        writer.close()
                        writer = None
                        yield unit, path
                    unit, path = current, os.path.join(folder, f"unit-{current}.arrow")
                    writer = pa.ipc.new_stream(path, OUTGOING_SCHEMA)
                writer.write_batch(
                    pa.RecordBatch.from_arrays(
                        [part.column(name) for name in OUTGOING_SCHEMA.names],
                        schema=OUTGOING_SCHEMA,
                    )
                )
        if writer is not None:
            writer.close()
            writer = None
            yield unit, path
    finally:
        if writer is not None:
            with contextlib.suppress(Exception):
                writer.close()


def _runs(batch: pa.RecordBatch) -> Iterator[tuple[int, pa.RecordBatch]]:
    """The runs of equal `unit` in `batch` (sorted by it): (unit, rows)."""
    units = batch.column("unit").to_numpy(zero_copy_only=False)
    starts = [0, *(np.flatnonzero(units[1:] != units[:-1]) + 1).tolist()]
    ends = [*starts[1:], batch.num_rows]
    for start, end in zip(starts, ends, strict=True):
        if end > start:
            yield int(units[start]), batch.slice(start, end - start)


def _produce_unit(plan: ProducePlan, unit: int, path: str) -> int:
    """Produce unit `unit` of `plan`'s batch from its spooled file, once."""
    key = (plan.bootstrap_servers, transactional_id(plan.app_id, unit))
    producer = _producers.take(
        key,
        lambda: UnitProducer(
            plan.job,
            plan.app_id,
            unit,
            plan.bootstrap_servers,
            plan.options,
            signing_key=plan.signing_key,
            reader_options=plan.reader_options,
            secret_options=plan.secret_options,
            topic_max_bytes=lambda: plan.topic_max_bytes,
        ),
    )

    def records() -> Iterator[pa.RecordBatch]:
        with pa.ipc.open_stream(pa.memory_map(path)) as reader:
            yield from reader

    # One that raises is not kept: it has let go of its Kafka producer already.
    produced = producer.produce_once(plan.batch_id, records, plan.control_from)
    _producers.give(key, producer)
    return produced
