"""Records bound for Kafka (retry tiers, dead-letter topic), staged in Parquet, produced once.

Executors decide what to send and stage it in Parquet files; the driver produces a batch's
staged records in one Kafka transaction that also writes a marker (key: the checkpoint's app
id, value: the batch id) to the job's one-partition control topic. Readers use
read_committed, so a crash mid-produce leaves no visible half, and a replayed batch that
finds its marker produces nothing again.

Why the marker check can be trusted:

- It runs only on a producer that has completed `init_transactions` since the last failure,
  after the transactional id used before it was initialised once more. That settles the
  earlier transaction (a commit in progress is finished, an open one aborted) and fences off
  a zombie instance of the job, so no marker can turn up after the check says "not produced".
- It reads the control topic with read_committed, from the end backwards in growing windows
  until it finds a committed marker of this app id, so any number of aborted transactions
  (their records and markers take offsets, as do commit markers) cannot hide the last
  committed one. Reads stop at the partition's end (EOF, the last stable offset), never by
  waiting out a timeout, and each window uses a fresh consumer (a reused one may hand out
  a previous read's messages or end-of-partition event).
- Batch ids of one checkpoint grow, so its last committed marker holds its highest produced
  batch. Markers of other app ids (an earlier checkpoint of the same job) are passed over.
- After each commit the marker is read back; a transaction the broker dropped although the
  commit call succeeded (noida-db 0.2.3 does so when it restarts mid-transaction) is found
  there and produced again.

A transactional id is never used again once one of its transactions may have been aborted:
the generation in its name (kept in the checkpoint's state directory) moves on whenever a
producer is created, at start and after any failure. Some brokers (noida-db 0.2.3) hide
every later record of a producer from a read_committed fetch that starts after one of its
aborted transactions; a producer whose history ends at its first abort is safe from that.

Any failure (broker away, coordinator moved, transaction timed out or dropped) discards the
producer and retries the whole step (new producer, marker check, transaction) for up to
`retry_seconds`; the job so rides through a short broker restart, and fails loudly after.
Being fenced is not retried: a newer instance of the job runs, and retrying would fence it
in turn.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterable, Mapping

import pyarrow as pa
import pyarrow.parquet as pq
from confluent_kafka import (
    OFFSET_END,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)

from retrylib.dead_letter import HEADERS_TYPE
from retrylib.errors import RetrylibError
from retrylib.faults import crash_point
from retrylib.kafka_client import make_consumer, make_producer
from retrylib.storage import filesystem, join, read_json, write_json

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


class TransactionLost(RetrylibError):
    """Raised when a committed transaction's marker cannot be read back."""


def control_topic(job_name: str) -> str:
    """The one-partition topic holding the id of each batch whose records were produced."""
    return f"_retrylib.{job_name}.produced"


class StagedProducer:
    """Produces a batch's staged records exactly once (see the module docstring).

    `state_dir` (in the checkpoint) keeps the generation of the transactional id,
    "retrylib-<app id>-<generation>". Creating the producer fences off any earlier instance
    of this checkpoint's job. Raises `KafkaException` from the constructor when the broker
    cannot initialise transactions.
    """

    def __init__(
        self,
        job_name: str,
        app_id: str,
        bootstrap: str,
        options: Mapping[str, str],
        *,
        state_dir: str,
        retry_seconds: float = PRODUCE_RETRY_SECONDS,
    ) -> None:
        self._job = job_name
        self._app_id = app_id
        self._key = app_id.encode()
        self._bootstrap = bootstrap
        self._options = dict(options)
        self._topic = control_topic(job_name)
        self._generation_uri = join(state_dir, "producer.json")
        self._retry_seconds = retry_seconds
        self._producer: Producer | None = None
        # The last produced batch as known to the current producer: read once after it is
        # created, then set by each verified commit. While that producer is not fenced, no one
        # else can have committed a marker since it started.
        self._known_last: int | None = None
        self._known = False
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
                if not self._known:
                    self._known_last, self._known = self.last_produced_batch(), True
                done = self._known_last
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
            except (KafkaException, MarkerReadError, TransactionLost) as e:
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
            except BaseException:
                self._discard_producer()  # it may hold an aborted transaction: never reuse
                raise

    def _produce_transaction(self, batch_id: int, files: list[str]) -> int:
        """One transaction: the records of `files` and the marker; returns the record count.

        Before committing, every record is acknowledged and each partition written to must
        still hold its last stable offset at or below the transaction's first record there
        (an intact open transaction does). After committing, the marker must read back.
        """
        producer = self._producer
        assert producer is not None
        deliveries = _Deliveries()
        producer.begin_transaction()
        try:
            count = sum(self._produce_file(producer, path, deliveries) for path in files)
            _produce(
                producer,
                {
                    "topic": self._topic,
                    "partition": 0,
                    "key": self._key,
                    "headers": None,
                    "value": str(batch_id).encode(),
                    "timestamp_ms": int(time.time() * 1000),
                },
                deliveries,
            )
            left = _serve(producer.flush, _COMMIT_TIMEOUT_S)
            deliveries.check(left)
            self._check_still_open(deliveries.first_offsets)
            crash_point("in_produce", batch_id)
            producer.commit_transaction(_COMMIT_TIMEOUT_S)
        except BaseException as error:
            # A failed abort leaves the transaction to the next producer's start. Its error
            # tells reliably whether this producer was fenced, which the first error (say, a
            # delivery callback's) may not.
            try:
                producer.abort_transaction(30)
            except KafkaException as abort_error:
                if _fenced(abort_error) and not _fenced(error):
                    raise abort_error from error
            raise
        seen = self.last_produced_batch()
        if seen != batch_id:
            raise TransactionLost(
                f"the transaction of batch {batch_id} was committed, but its marker is not in "
                f"{self._topic} (last marker: batch {seen}): the broker dropped it"
            )
        self._known_last = batch_id
        return count

    def _check_still_open(self, first_offsets: Mapping[tuple[str, int], int]) -> None:
        """Raise `TransactionLost` when the broker already ended part of the open transaction.

        A broker that loses transaction state when it restarts (noida-db 0.2.3) aborts what
        was sent before and then lets the rest commit on its own. The open transaction holds
        each partition's last stable offset at its first record there; an offset past it
        shows the split, and aborting the whole transaction keeps the batch all-or-nothing.
        """
        consumer = make_consumer(
            self._bootstrap, {**self._options, "isolation.level": "read_committed"}
        )
        try:
            answers = consumer.offsets_for_times(
                [TopicPartition(t, p, OFFSET_END) for t, p in first_offsets],
                timeout=_WATERMARK_TIMEOUT_S,
            )
        finally:
            consumer.close()
        for answer in answers:
            if answer.error is not None:
                raise KafkaException(answer.error)
            first = first_offsets[(answer.topic, answer.partition)]
            if answer.offset > first:
                raise TransactionLost(
                    f"{answer.topic}[{answer.partition}] is stable up to offset "
                    f"{answer.offset}, past this open transaction's first record at {first}: "
                    "the broker ended part of the transaction (did it restart?)"
                )

    def _produce_file(self, producer: Producer, path: str, deliveries: _Deliveries) -> int:
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
                _produce(producer, row, deliveries)
                count += 1
        return count

    def _new_producer(self) -> Producer:
        """A producer on a transactional id of a new generation, transactions initialised.

        The id of the generation before is initialised first: that fences whoever still uses
        it and settles its last transaction. The new generation is recorded before its id is
        first used, so no id is ever used by two generations.
        """
        state = read_json(self._generation_uri) or {}
        previous = state.get("generation")
        if previous is not None:
            self._transactional_producer(previous).init_transactions(_INIT_TIMEOUT_S)
        generation = 0 if previous is None else previous + 1
        write_json(self._generation_uri, {"generation": generation})
        producer = self._transactional_producer(generation)
        producer.init_transactions(_INIT_TIMEOUT_S)
        log.info("producing with transactional.id %s", self._transactional_id(generation))
        return producer

    def _transactional_id(self, generation: int) -> str:
        return f"retrylib-{self._app_id}-{generation}"

    def _transactional_producer(self, generation: int) -> Producer:
        return make_producer(
            self._bootstrap,
            {
                **self._options,
                "transactional.id": self._transactional_id(generation),
                "linger.ms": "20",
            },
        )

    def _discard_producer(self) -> None:
        """Drop the producer after a failure; the next use creates (and initialises) one."""
        producer, self._producer = self._producer, None
        self._known = False
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


class _Deliveries:
    """Delivery reports of one transaction: first offset per partition, and any error."""

    def __init__(self) -> None:
        self.first_offsets: dict[tuple[str, int], int] = {}
        self.error: KafkaError | None = None

    def __call__(self, error: KafkaError | None, message) -> None:
        if error is not None:
            self.error = self.error or error
            return
        key = (message.topic(), message.partition())
        offset = message.offset()
        if offset < self.first_offsets.get(key, offset + 1):
            self.first_offsets[key] = offset

    def check(self, left: int) -> None:
        """Raise `KafkaException` unless every record was delivered (`left` still queued)."""
        if self.error is not None:
            raise KafkaException(self.error)
        if left:
            raise KafkaException(
                KafkaError(KafkaError._TIMED_OUT, f"{left} record(s) not delivered in time")
            )


def _produce(producer: Producer, row: dict, deliveries: _Deliveries) -> None:
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
                on_delivery=deliveries,
            )
            return
        except BufferError:  # local queue full: let deliveries drain, then try again
            _serve(producer.poll, 0.1)


def _serve(call, timeout: float) -> int:
    """`producer.flush` or `producer.poll`, which run delivery callbacks.

    After a fatal producer error (fenced, say) confluent-kafka calls the callbacks with that
    error already raised, which surfaces as a `SystemError`; it is raised here as the
    `KafkaException` it stands for.
    """
    try:
        return call(timeout)
    except SystemError as e:
        error: BaseException | None = e
        while error is not None and not isinstance(error, KafkaException):
            error = error.__cause__ or error.__context__
        if error is not None:
            raise error from None
        raise KafkaException(KafkaError(KafkaError._FAIL, f"producer failed: {e}")) from e
