"""Records bound for Kafka (retry tiers, dead-letter topic), staged in Parquet, produced once.

Executors decide what to send and stage it in Parquet files; the driver produces a batch's
staged records in one Kafka transaction that also writes a marker (key: the checkpoint's app
id, value: the batch id) to the job's one-partition control topic. Readers use
read_committed, so a crash mid-produce leaves no visible half, and a replayed batch that
finds its marker produces nothing again.

Why the marker check can be trusted:

- It runs only on a producer that has completed `init_transactions` since the last failure.
  That call settles any earlier transaction of the same `transactional.id` (a commit in
  progress is finished, an open one aborted) and fences off a zombie instance of the job, so
  no marker can turn up after the check says "not produced".
- It reads the control topic with read_committed, from the end backwards in growing windows
  until it finds a committed marker, so any number of aborted transactions (their records
  and markers take offsets, as do commit markers) cannot hide the last committed one. Reads
  stop at the partition's end (EOF, the last stable offset), never by waiting out a timeout.
- Batch ids of one checkpoint grow, so its last committed marker holds its highest produced
  batch. Markers of other app ids (an earlier checkpoint of the same job) are passed over.

Any other failure (broker away, coordinator moved, a transaction timed out) discards the
producer and retries the whole step (fresh `init_transactions`, marker check, transaction)
for up to `retry_seconds`; the job so rides through a short broker restart, and fails
loudly after. Being fenced is not retried: a newer instance of the job runs, and retrying
would fence it in turn.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterable, Mapping

import pyarrow as pa
import pyarrow.parquet as pq
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from retrylib.dead_letter import HEADERS_TYPE
from retrylib.errors import RetrylibError
from retrylib.faults import armed, crash_point
from retrylib.kafka_client import make_consumer, make_producer
from retrylib.storage import filesystem

log = logging.getLogger(__name__)

STAGED_SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string(), nullable=False),
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("timestamp_ms", pa.int64(), nullable=False),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("headers", HEADERS_TYPE),
    ]
)

MARKER_WINDOW = 64
"""Offsets of the control topic read first when looking for the last marker (then 2x, 4x...)."""
MARKER_READ_TIMEOUT_S = 30.0
"""A marker read that reaches neither its window's end nor the partition's end in this long
fails (and is retried) instead of guessing."""
PRODUCE_RETRY_SECONDS = 90.0
"""How long `produce_once` keeps retrying a batch through Kafka errors before it fails."""
_INIT_TIMEOUT_S = 30.0
_COMMIT_TIMEOUT_S = 60.0
_WATERMARK_TIMEOUT_S = 15.0


class ProduceError(RetrylibError):
    """Raised when a batch's staged records could not be produced (after retrying)."""


class MarkerReadError(RetrylibError):
    """Raised when the control topic could not be read to the end in time."""


def control_topic(job_name: str) -> str:
    """The one-partition topic holding the id of each batch whose records were produced."""
    return f"_retrylib.{job_name}.produced"


class StagedProducer:
    """Produces a batch's staged records exactly once (see the module docstring).

    Uses a transactional producer with `transactional.id` derived from the job name; creating
    one fences off any earlier instance of the job. Raises `KafkaException` from the
    constructor when the broker cannot initialise transactions.
    """

    def __init__(
        self,
        job_name: str,
        app_id: str,
        bootstrap: str,
        options: Mapping[str, str],
        *,
        retry_seconds: float = PRODUCE_RETRY_SECONDS,
    ) -> None:
        self._job = job_name
        self._app_id = app_id
        self._key = app_id.encode()
        self._bootstrap = bootstrap
        self._options = dict(options)
        self._topic = control_topic(job_name)
        self._retry_seconds = retry_seconds
        self._producer: Producer | None = None
        self._producer = self._new_producer()  # fence zombies as soon as the job starts

    # -- the marker ---------------------------------------------------------------------

    def last_produced_batch(self) -> int | None:
        """The highest batch id with a committed marker of this app id, or None.

        Raises `KafkaException` or `MarkerReadError` when the topic cannot be read; it never
        answers None for a topic it could not read to the end.
        """
        consumer = self._marker_consumer()
        try:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(self._topic, 0), _WATERMARK_TIMEOUT_S, cached=False
            )
            end, window = high, MARKER_WINDOW
            while end > low:
                start = max(low, end - window)
                batches = self._markers_between(consumer, start, end)
                if batches:
                    return max(batches)
                consumer.close()
                # A consumer that read before may still hand out that read's messages or
                # end-of-partition event after a new assign(): each window gets a fresh one.
                consumer = self._marker_consumer()
                end, window = start, window * 2
            return None
        finally:
            with contextlib.suppress(Exception):
                consumer.close()

    def _markers_between(self, consumer: Consumer, start: int, end: int) -> list[int]:
        """Batch ids of our committed markers at offsets `start`..`end` (exclusive).

        `consumer` must be fresh (see `last_produced_batch`).
        """
        consumer.assign([TopicPartition(self._topic, 0, start)])
        batches: list[int] = []
        deadline = time.monotonic() + MARKER_READ_TIMEOUT_S
        while True:
            message = consumer.poll(0.5)
            if message is None:
                if time.monotonic() > deadline:
                    raise MarkerReadError(
                        f"reading {self._topic} offsets {start}..{end}: no answer for "
                        f"{MARKER_READ_TIMEOUT_S:.0f}s"
                    )
                continue
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    return batches  # the end of what is committed
                raise KafkaException(error)
            if message.offset() >= end:
                return batches
            if message.offset() >= start and message.key() == self._key:
                batch = _marker_batch(message.value())
                if batch is not None:
                    batches.append(batch)

    def _marker_consumer(self) -> Consumer:
        return make_consumer(
            self._bootstrap,
            {
                **self._options,
                "isolation.level": "read_committed",
                "enable.partition.eof": True,
                "auto.offset.reset": "earliest",
            },
            group_id=f"retrylib-{self._job}-markers",
        )

    # -- producing ----------------------------------------------------------------------

    def produce_once(self, batch_id: int, staged_files: Iterable[str]) -> int:
        """Produce the records in `staged_files` for `batch_id` unless already done.

        Returns the number of records produced (0 when the marker shows they were). Kafka
        errors are retried for `retry_seconds`, each time on a fresh producer; then
        `ProduceError` is raised (the batch fails and is replayed on restart). Raises
        `RetrylibError` when the marker of a later batch is found: the query's checkpoint
        is behind what this job name already produced (see `BatchRouter`).
        """
        files = list(staged_files)
        deadline = time.monotonic() + self._retry_seconds
        failures = 0
        while True:
            try:
                if self._producer is None:
                    self._producer = self._new_producer()
                done = self.last_produced_batch()
                if done is not None and done > batch_id:
                    raise RetrylibError(
                        f"control topic {self._topic} holds the marker of batch {done} of "
                        f"{self._app_id}, but the query is running batch {batch_id}: the "
                        "checkpoint is older than what it already produced. Restore the "
                        "checkpoint, or start from a new one"
                    )
                if done == batch_id:
                    log.info("records of batch %d were produced before; skipped", batch_id)
                    return 0
                return self._produce_transaction(batch_id, files)
            except (KafkaException, MarkerReadError) as e:
                failures += 1
                self._discard_producer()
                if _fenced(e):
                    raise ProduceError(
                        f"producing the records of batch {batch_id} failed: another instance "
                        f"of job {self._job!r} took over its Kafka transactions ({e}); this "
                        "one stops, as two instances must not run the same checkpoint"
                    ) from e
                if time.monotonic() >= deadline:
                    raise ProduceError(
                        f"producing the records of batch {batch_id} failed "
                        f"{failures} time(s) over {self._retry_seconds:.0f}s; last error: {e}"
                    ) from e
                pause = min(0.5 * 2 ** (failures - 1), 5.0)
                log.warning(
                    "producing the records of batch %d failed (%s); retrying in %.1fs with a "
                    "new producer",
                    batch_id,
                    e,
                    pause,
                )
                time.sleep(pause)

    def _produce_transaction(self, batch_id: int, files: list[str]) -> int:
        producer = self._producer
        assert producer is not None
        producer.begin_transaction()
        try:
            count = sum(self._produce_file(producer, path) for path in files)
            if armed("in_produce"):
                producer.flush(30)  # so the open transaction's records reach the broker
            crash_point("in_produce", batch_id)
            producer.produce(self._topic, key=self._key, value=str(batch_id).encode(), partition=0)
            producer.commit_transaction(_COMMIT_TIMEOUT_S)
        except BaseException:
            # Best effort: a failed abort leaves the transaction to the next init_transactions.
            with contextlib.suppress(KafkaException):
                producer.abort_transaction(30)
            raise
        return count

    def _produce_file(self, producer: Producer, path: str) -> int:
        fs, local = filesystem(path)
        try:
            parquet = pq.ParquetFile(local, filesystem=fs)
        except FileNotFoundError as e:
            raise RetrylibError(
                f"staged file {path} is gone but its batch has no marker in {self._topic}"
            ) from e
        count = 0
        for batch in parquet.iter_batches(batch_size=5000):
            for row in batch.to_pylist():
                _produce(producer, row)
                count += 1
        return count

    def _new_producer(self) -> Producer:
        producer = make_producer(
            self._bootstrap,
            {**self._options, "transactional.id": f"retrylib-{self._job}", "linger.ms": "20"},
        )
        producer.init_transactions(_INIT_TIMEOUT_S)
        return producer

    def _discard_producer(self) -> None:
        """Drop the producer after a failure; the next use creates (and initialises) one."""
        producer, self._producer = self._producer, None
        if producer is not None:
            with contextlib.suppress(Exception):
                producer.purge()

    def close(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            producer.flush(30)


_FENCED_CODES = frozenset(
    {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
)


def _fenced(error: Exception) -> bool:
    """True when `error` says a newer producer with our transactional.id took over.

    Retrying would fence that newer instance in turn, so such an error ends the batch.
    """
    if not isinstance(error, KafkaException) or not error.args:
        return False
    kafka_error = error.args[0]
    return isinstance(kafka_error, KafkaError) and kafka_error.code() in _FENCED_CODES


def _marker_batch(value: bytes | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _produce(producer: Producer, row: dict) -> None:
    headers = [(h["key"], h["value"]) for h in row["headers"] or ()]
    while True:
        try:
            producer.produce(
                row["topic"],
                key=row["key"],
                value=row["value"],
                headers=headers,
                partition=row["partition"],
                timestamp=row["timestamp_ms"],
            )
            return
        except BufferError:  # local queue full: let deliveries drain, then try again
            producer.poll(0.1)
