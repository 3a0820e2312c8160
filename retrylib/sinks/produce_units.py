"""The produce tasks: on an executor, a batch's outgoing records produced in units, each in
one Kafka transaction with its marker, so each unit is produced once.

The driver runs one Spark job over a batch's outgoing records, a partition per unit in unit
order (`retrylib.batch.produce_units`); each of its tasks runs `produce_task`. It first writes
its rows to a local Arrow file (the worker's temporary directory), then produces each unit
from it: a failed transaction is produced again from the file, and Spark's shuffle read does
not count against the transaction's timeout. A Python worker keeps its producers, one per
unit id it served, across tasks and batches (`worker_clients.Pool`).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from retrylib.kafka.worker_clients import MAX_PRODUCERS, Pool, opened
from retrylib.logs import configure_worker_logging
from retrylib.sinks.outgoing_records import OUTGOING_SCHEMA
from retrylib.sinks.transactional_producer import UnitProducer, transactional_id

UNIT_RESULT_SCHEMA = pa.schema(
    [
        pa.field("unit", pa.int32(), nullable=False),
        pa.field("produced", pa.int64(), nullable=False),
        pa.field("clients_opened", pa.int64(), nullable=False),
    ]
)


@dataclass(frozen=True)
class ProducerSettings:
    """What every produce task of a job needs, the same for each batch, built on the driver."""

    job: str
    app_id: str
    bootstrap_servers: str
    options: Mapping[str, str]  # the producers'
    reader_options: Mapping[str, str]  # the consumer's that looks for markers
    signing_key: bytes
    secret_options: tuple[str, ...] = ()
    topic_max_bytes: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ProducePlan:
    """What the produce tasks of one batch need: the job's `settings`, and the batch's part,
    set for each batch from its manifest."""

    settings: ProducerSettings
    batch_id: int
    units: int  # the routing tasks' partitions: unit ids are below it
    control_from: int  # the control topic's end before the batch's first produce
    # Epoch ms before which no record is produced: a delay router's records read ahead are
    # due by then (`results.NOT_BEFORE_MS`); 0 for none.
    not_before_ms: int = 0


_producers: Pool[UnitProducer] = Pool(MAX_PRODUCERS, lambda producer: producer.close())


def produce_task(plan: ProducePlan, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
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
    settings = plan.settings
    key = (settings.bootstrap_servers, transactional_id(settings.app_id, unit))
    producer = _producers.take(
        key,
        lambda: UnitProducer(
            settings.job,
            settings.app_id,
            unit,
            settings.bootstrap_servers,
            settings.options,
            signing_key=settings.signing_key,
            reader_options=settings.reader_options,
            secret_options=settings.secret_options,
            topic_max_bytes=lambda: settings.topic_max_bytes,
        ),
    )

    def records() -> Iterator[pa.RecordBatch]:
        with pa.ipc.open_stream(pa.memory_map(path)) as reader:
            yield from reader

    # One that raises is not kept: it has let go of its Kafka producer already.
    produced = producer.produce_once(
        plan.batch_id, records, plan.control_from, not_before_ms=plan.not_before_ms
    )
    _producers.give(key, producer)
    return produced
