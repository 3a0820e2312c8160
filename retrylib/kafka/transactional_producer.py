"""The transactional producer: a batch's staged records (retry tiers, dead-letter topic),
produced to Kafka exactly once.

The driver produces a batch's records in one Kafka transaction that also writes a marker
(key: the checkpoint's app id, value: the batch id) to the job's one-partition control topic.
Readers use read_committed, so a crash mid-produce leaves no visible half, and a replayed
batch that finds its marker produces nothing again. The records come from a callable that
returns a fresh iterator of Arrow RecordBatches (`STAGED_SCHEMA`) each time, so every attempt
reads them anew. The records' form and their produce are `staged_records`; reading the marker
is `reading.last_marker`.

Each checkpoint has one transactional id, "retrylib-<app id>". Why the marker check can be
trusted:

- It runs only on a producer that has completed `init_transactions` since the last failure.
  That settles the id's earlier transaction (a commit in progress is finished, an open one is
  aborted) and bumps the producer epoch, which fences a zombie instance of the job and any
  producer this one discarded, so no marker can turn up after the check says "not produced".
- It reads the control topic with read_committed, from the end backwards in growing windows
  until it finds a committed marker of this app id, so any number of aborted transactions
  (their records and markers take offsets, as do commit markers) cannot hide the last
  committed one. Reads stop at the partition's end (EOF, the last stable offset), never by
  waiting out a timeout.
- Batch ids of one checkpoint grow, so its last committed marker holds its highest produced
  batch. Markers of other app ids (an earlier checkpoint of the same job) are passed over.
- Once a producer has read the marker, it tracks the last batch itself: while it is not
  fenced, nobody else can commit a marker of this app id.

Any failure (broker away, coordinator moved, delivery timed out) discards the producer and
retries the whole step (new producer on the same id, marker check, transaction) for up to
`retry_seconds`; the job so rides through a broker restart, and fails loudly after. Being
fenced is not retried: another instance of the job took over the id, or the transaction
stayed open longer than `transaction.timeout.ms` and the broker aborted it (librdkafka
reports both as fenced); retrying would fence that other instance in turn.
"""

from __future__ import annotations

import contextlib
import logging
import time
import traceback
from collections.abc import Callable, Mapping

from confluent_kafka import KafkaError, KafkaException, Producer

from retrylib.config.topics import produced_topic
from retrylib.errors import MarkerReadError, ProduceError, RetrylibError
from retrylib.faults import crash_point
from retrylib.kafka.clients import make_producer
from retrylib.kafka.reading import last_marker, produce, reading_consumer, serve
from retrylib.kafka.staged_records import Deliveries, StagedRecords, produce_staged

log = logging.getLogger(__name__)

PRODUCE_RETRY_SECONDS = 90.0
"""How long `produce_once` keeps retrying a batch through Kafka errors before it fails."""
_INIT_TIMEOUT_S = 30.0
_COMMIT_TIMEOUT_S = 60.0
_ABORT_TIMEOUT_S = 30.0


class StagedProducer:
    """Produces a batch's staged records exactly once (see the module docstring).

    Its transactional id is "retrylib-<app id>". Creating it initialises transactions on that
    id, which fences off any earlier instance of this checkpoint's job and aborts its open
    transaction. Raises `KafkaException` from the constructor when the broker cannot
    initialise transactions.
    """

    def __init__(
        self,
        job_name: str,
        app_id: str,
        bootstrap: str,
        options: Mapping[str, str],
        *,
        retry_seconds: float = PRODUCE_RETRY_SECONDS,
        topic_max_bytes: Callable[[], Mapping[str, int]] = dict,
    ) -> None:
        """`topic_max_bytes` gives the topics' known `max.message.bytes`, for messages."""
        self._job = job_name
        self._app_id = app_id
        self._key = app_id.encode()
        self._bootstrap = bootstrap
        self._options = dict(options)
        self._topic = produced_topic(job_name)
        self._transactional_id = f"retrylib-{app_id}"
        self._retry_seconds = retry_seconds
        self._topic_max_bytes = topic_max_bytes
        self._producer: Producer | None = None
        # The last produced batch as known to the current producer: read once after it is
        # created, then set by each commit. While that producer is not fenced, no one else
        # can have committed a marker since it started.
        self._known_last: int | None = None
        self._known = False
        self._producer = self._new_producer()  # fence zombies as soon as the job starts

    @property
    def transactional_id(self) -> str:
        """The Kafka transactional id of this checkpoint: "retrylib-<app id>"."""
        return self._transactional_id

    # -- the marker ---------------------------------------------------------------------

    def last_produced_batch(self) -> int | None:
        """The highest batch id with a committed marker of this app id, or None.

        Raises `KafkaException` or `MarkerReadError` when the topic cannot be read; it never
        answers None for a topic it could not read to the end.
        """
        consumer = reading_consumer(
            self._bootstrap, self._options, group_id=f"retrylib-{self._job}-markers"
        )
        try:
            return last_marker(consumer, self._topic, self._key)
        finally:
            with contextlib.suppress(Exception):
                consumer.close()

    # -- producing ----------------------------------------------------------------------

    def produce_once(self, batch_id: int, records: StagedRecords) -> int:
        """Produce the records that `records()` yields for `batch_id` unless already done.

        `records` is called once per attempt, inside the attempt's open transaction, and must
        return a fresh iterator of RecordBatches with the `STAGED_SCHEMA` columns each time;
        it is not called when the marker shows the batch was produced. The time it takes
        counts against the transaction's `transaction.timeout.ms`.

        Returns the number of records produced (0 when the marker shows they were). Kafka
        errors are retried for `retry_seconds`, each time on a fresh producer; then
        `ProduceError` is raised (the batch fails and is replayed on restart). Being fenced
        raises `ProduceError` at once, a record refused as too large `RecordTooLargeError`
        (naming topic, size, limit and the setting to change). Raises `RetrylibError` when
        the marker of a later batch is found (the query's checkpoint is behind what this job
        name already produced, see `BatchRouter`) or a RecordBatch lacks a column; an
        exception from `records` itself is raised as it is. Nothing of an attempt that
        failed is visible to read_committed readers.
        """
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
                return self._produce_transaction(batch_id, records)
            except (KafkaException, MarkerReadError) as e:
                failures += 1
                self._discard_producer(e)
                if _fenced(e):
                    raise ProduceError(
                        f"producing the records of batch {batch_id} failed: its Kafka "
                        f"transaction was fenced ({e}). Either another instance of job "
                        f"{self._job!r} took over transactional id {self._transactional_id} "
                        "(two instances must not run the same checkpoint: this one stops), "
                        "or the transaction stayed open longer than transaction.timeout.ms "
                        "and the broker aborted it"
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
                    str(e),
                    pause,
                )
                time.sleep(pause)
            except BaseException as e:
                self._discard_producer(e)  # it may hold an open transaction: never reuse
                raise

    def _produce_transaction(self, batch_id: int, records: StagedRecords) -> int:
        """One transaction: the records of `records()` and the marker; returns the count.

        Every record is acknowledged before the commit.
        """
        producer = self._producer
        assert producer is not None
        deliveries = Deliveries()
        producer.begin_transaction()
        try:
            count = produce_staged(producer, batch_id, records, deliveries, self._options)
            produce(
                producer,
                self._topic,
                key=self._key,
                value=str(batch_id).encode(),
                partition=0,
                timestamp_ms=int(time.time() * 1000),
                on_delivery=deliveries,
            )
            left = serve(producer.flush, _COMMIT_TIMEOUT_S)
            deliveries.check(left, self._topic_max_bytes())
            crash_point("in_produce", batch_id)
            producer.commit_transaction(_COMMIT_TIMEOUT_S)
        except BaseException as error:
            # A failed abort leaves the transaction to the next producer's init_transactions.
            # Its error tells reliably whether this producer was fenced, which the first
            # error (say, a delivery callback's) may not.
            try:
                producer.abort_transaction(_ABORT_TIMEOUT_S)
            except KafkaException as abort_error:
                if _fenced(abort_error) and not _fenced(error):
                    raise abort_error from error
            raise
        self._known_last = batch_id
        log.info("produced %d record(s) of batch %d in one transaction", count, batch_id)
        return count

    def _new_producer(self) -> Producer:
        """A producer on this checkpoint's transactional id, transactions initialised."""
        producer = make_producer(
            self._bootstrap,
            {**self._options, "transactional.id": self._transactional_id, "linger.ms": "20"},
        )
        producer.init_transactions(_INIT_TIMEOUT_S)
        log.info("producing with transactional.id %s", self._transactional_id)
        return producer

    def _discard_producer(self, error: BaseException) -> None:
        """Drop the producer after `error`; the next attempt creates (and initialises) one.

        confluent-kafka destroys a client when its last reference goes. That must happen
        here, before a new producer initialises the same id: an operation the old one still
        has under way would otherwise bump the epoch later and fence the new one (seen with
        Apache Kafka 4.1: a producer kept alive after its init_transactions timed out while
        the broker was down took a new epoch once the broker was back, and the producer made
        after it was fenced). The frames of `error`'s traceback, which the caller may keep,
        hold the old producer too, so their locals are cleared.
        """
        producer, self._producer = self._producer, None
        self._known = False
        _clear_frames(error)
        if producer is not None:
            with contextlib.suppress(Exception):
                producer.purge()

    def close(self) -> None:
        """Release the producer; between batches it holds no open transaction."""
        producer, self._producer = self._producer, None
        if producer is not None:
            producer.flush(30)


_FENCED_CODES = frozenset(
    {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
)


def _fenced(error: BaseException) -> bool:
    """True when `error` says the producer's epoch is over: a newer producer with our
    transactional.id took over, or the broker aborted a transaction that outlived its timeout.

    Retrying would fence that newer instance in turn, so such an error ends the batch.
    """
    if not isinstance(error, KafkaException) or not error.args:
        return False
    kafka_error = error.args[0]
    return isinstance(kafka_error, KafkaError) and kafka_error.code() in _FENCED_CODES


def _clear_frames(error: BaseException) -> None:
    """Clear the locals of the finished frames in the tracebacks of `error` and its causes."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        traceback.clear_frames(current.__traceback__)
        current = current.__cause__ or current.__context__
