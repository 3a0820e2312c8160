"""The transactional producer: one produce unit of a batch's outgoing records (retry tiers,
dead-letter topic, a delay router's destinations), produced to Kafka exactly once.

A batch's outgoing records are split into produce units (`produce_units`), each produced by
one Spark task in one Kafka transaction that also writes the unit's marker (`markers`) to the
job's one-partition control topic. Readers use read_committed, so a crash mid-produce leaves
no visible half, and an attempt that finds its unit's marker produces nothing again. The
records come from a callable that returns a fresh iterator of Arrow RecordBatches
(`OUTGOING_SCHEMA`) each time, so every attempt reads them anew. The records' form and their
produce are `outgoing_records`.

Each unit of a checkpoint has its own transactional id, "retrylib-<app id>-<unit>", the same
for every batch, attempt and restart. Why the marker check can be trusted:

- It runs only on a producer that has completed `init_transactions` since the last failure.
  That settles the id's earlier transaction (a commit in progress is finished, an open one is
  aborted) and bumps the producer epoch, which fences every earlier producer of the unit (a
  failed task attempt, a zombie on a lost executor, a run before a crash), so no marker of
  the unit can turn up after the check says "not produced".
- It reads the control topic read_committed from the offset the batch recorded in its
  manifest before any of its units was produced, up to the high watermark, waiting for
  transactions still open below it (`markers.unit_produced`).
- Once a producer has checked, it tracks the unit's last batch itself: while it is not fenced,
  nobody else can commit a marker of the unit. A Python worker keeps its producers across
  tasks (`produce_units`); when another worker took the unit's id since, the kept producer is
  fenced at its first transaction, and is replaced by a new one that checks again.

Any other failure (broker away, coordinator moved, delivery timed out) discards the producer
and retries the whole step (new producer on the same id, marker check, transaction) for up to
`retry_seconds`; a task so rides through a broker restart, and fails loudly after. A topic
that Kafka no longer has, or has with fewer partitions than a record is bound for (deleted and
created again under the running job), fails the task at once, naming it. A producer
made in this call being fenced is not retried: another attempt of the unit took over the id
(Spark ran the task again, or another instance of the job runs the same checkpoint), or the
transaction stayed open longer than `transaction.timeout.ms` and the broker aborted it
(librdkafka reports both as fenced); retrying would fence that other attempt in turn.
"""

from __future__ import annotations

import contextlib
import logging
import time
import traceback
from collections.abc import Callable, Mapping

from confluent_kafka import KafkaError, KafkaException, Producer

from retrylib.config.topic_names import produced_topic
from retrylib.errors import MarkerReadError, ProduceError, RetrylibError, TopicError, causes
from retrylib.kafka.clients import make_producer
from retrylib.kafka.reading import produce, serve
from retrylib.kafka.worker_clients import note_opened
from retrylib.retry.wall_clock import sleep_until
from retrylib.sinks.markers import marker_value, unit_produced
from retrylib.sinks.outgoing_records import (
    Deliveries,
    OutgoingRecords,
    PartitionMissing,
    produce_outgoing,
)
from retrylib.steps import reached

log = logging.getLogger(__name__)

PRODUCE_RETRY_SECONDS = 90.0
"""How long `produce_once` keeps retrying a unit through Kafka errors before it fails."""
_INIT_TIMEOUT_S = 30.0
_COMMIT_TIMEOUT_S = 60.0
_ABORT_TIMEOUT_S = 30.0
_METADATA_TIMEOUT_S = 10.0


def transactional_id(app_id: str, unit: int) -> str:
    """The Kafka transactional id of produce unit `unit` of app id `app_id`."""
    return f"retrylib-{app_id}-{unit}"


class UnitProducer:
    """Produces one unit's outgoing records of each batch exactly once (see the module
    docstring). It makes its Kafka producer when it first needs one, and keeps it between
    batches."""

    def __init__(
        self,
        job_name: str,
        app_id: str,
        unit: int,
        bootstrap: str,
        options: Mapping[str, str],
        *,
        signing_key: bytes,
        reader_options: Mapping[str, str] | None = None,
        secret_options: tuple[str, ...] = (),
        retry_seconds: float = PRODUCE_RETRY_SECONDS,
        topic_max_bytes: Callable[[], Mapping[str, int]] = dict,
    ) -> None:
        """`options` are the producer's Kafka options, `reader_options` those of the consumer
        that looks for markers (default: `options`); `topic_max_bytes` gives the topics' known
        `max.message.bytes`, for messages."""
        self._job = job_name
        self._app_id = app_id
        self._unit = unit
        self._reader_options = dict(options if reader_options is None else reader_options)
        self._key = app_id.encode()
        self._signing_key = signing_key
        self._bootstrap = bootstrap
        self._options = dict(options)
        self._secret_options = secret_options
        self._topic = produced_topic(job_name)
        self._transactional_id = transactional_id(app_id, unit)
        self._retry_seconds = retry_seconds
        self._topic_max_bytes = topic_max_bytes
        self._producer: Producer | None = None
        # The unit's last produced batch as known to the current producer: checked once after
        # it is created, then set by each commit. While that producer is not fenced, no one
        # else can have committed a marker of the unit since it started.
        self._known_last: int | None = None
        self._known = False

    @property
    def transactional_id(self) -> str:
        """The Kafka transactional id of this unit: "retrylib-<app id>-<unit>"."""
        return self._transactional_id

    def produced(self, batch_id: int, since: int) -> bool:
        """True when the control topic holds this unit's committed marker of `batch_id`,
        looking from offset `since` (`markers.unit_produced`)."""
        return unit_produced(
            self._bootstrap,
            self._reader_options,
            self._topic,
            signing_key=self._signing_key,
            app_id=self._app_id,
            batch_id=batch_id,
            unit=self._unit,
            since=since,
            secret_options=self._secret_options,
        )

    # -- producing ----------------------------------------------------------------------

    def produce_once(
        self, batch_id: int, records: OutgoingRecords, since: int, *, not_before_ms: int = 0
    ) -> int:
        """Produce the records that `records()` yields for `batch_id` unless already done.

        `since`: the control topic's offset before the batch's first produce (its manifest's).
        `not_before_ms`: the transaction begins no earlier than this (epoch ms, this host's
        clock); the producer is made and the marker checked before the wait.
        `records` is called once per attempt, inside the attempt's open transaction, and must
        return a fresh iterator of RecordBatches with the `OUTGOING_SCHEMA` columns each time;
        it is not called when the marker shows the unit was produced. The time it takes
        counts against the transaction's `transaction.timeout.ms`.

        Returns the number of records produced (0 when the marker shows they were). Kafka
        errors are retried for `retry_seconds`, each time on a fresh producer; then
        `ProduceError` is raised. A producer kept from an earlier call that turns out fenced
        is replaced at once; one made in this call being fenced raises `ProduceError`, a
        record refused as too large `RecordTooLargeError` (naming topic, size, limit and the
        setting to change), a record's topic found gone or with fewer partitions than the
        record's `TopicError` at once. Raises `RetrylibError` when this producer committed a
        later batch (the query runs from an older checkpoint) or a RecordBatch lacks a
        column; an exception from `records` itself is raised as it is. Nothing of an attempt that
        failed is visible to read_committed readers.
        """
        deadline = time.monotonic() + self._retry_seconds
        failures = 0
        while True:
            made_here = self._producer is None
            try:
                if self._producer is None:
                    self._producer = self._new_producer()
                if not self._known:
                    self._known_last = batch_id if self.produced(batch_id, since) else None
                    self._known = True
                done = self._known_last
                if done is not None and done > batch_id:
                    raise RetrylibError(
                        f"produce unit {self._unit} of {self._app_id} committed batch {done}, "
                        f"but the query is running batch {batch_id}: the checkpoint is older "
                        "than what it already produced. Restore the checkpoint, or start from "
                        "a new one"
                    )
                if done == batch_id:
                    log.info(
                        "records of batch %d unit %d were produced before; skipped",
                        batch_id,
                        self._unit,
                    )
                    return 0
                sleep_until(not_before_ms)
                return self._produce_transaction(batch_id, records)
            except (KafkaException, MarkerReadError) as e:
                if isinstance(e, PartitionMissing):
                    self._refuse_changed_topic(e, batch_id)
                self._discard_producer(e)
                if _fenced(e) and not made_here:
                    log.info(
                        "%s was taken over since this worker last used it; producing batch %d "
                        "with a new producer",
                        self._transactional_id,
                        batch_id,
                    )
                    continue
                failures += 1
                if _fenced(e):
                    raise ProduceError(
                        f"producing the records of batch {batch_id} failed: the Kafka "
                        f"transaction of {self._transactional_id} was fenced ({e}). Either "
                        "another attempt of the same work took over the id (Spark ran the task "
                        f"again, or another instance of job {self._job!r} runs the same "
                        "checkpoint: two instances must not), or the transaction stayed open "
                        "longer than transaction.timeout.ms and the broker aborted it"
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

    def _produce_transaction(self, batch_id: int, records: OutgoingRecords) -> int:
        """One transaction: the records of `records()` and the marker; returns the count.

        The marker is produced once every record is acknowledged, so that the transaction
        holds the control topic's stable offset back only for the moment of its commit.
        """
        producer = self._producer
        assert producer is not None
        deliveries = Deliveries()
        producer.begin_transaction()
        try:
            count = produce_outgoing(producer, batch_id, records, deliveries, self._options)
            deliveries.check(serve(producer.flush, _COMMIT_TIMEOUT_S), self._topic_max_bytes())
            produce(
                producer,
                self._topic,
                key=self._key,
                value=marker_value(self._signing_key, self._app_id, batch_id, self._unit),
                partition=0,
                timestamp_ms=int(time.time() * 1000),
                on_delivery=deliveries,
            )
            reached("in_produce", batch_id)
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
        reached("after_unit_commit", batch_id)
        log.info(
            "produced %d record(s) of batch %d unit %d in one transaction",
            count,
            batch_id,
            self._unit,
        )
        return count

    def _refuse_changed_topic(self, missing: PartitionMissing, batch_id: int) -> None:
        """Raise `TopicError` when fresh metadata shows the topic of `missing` gone, or with
        fewer partitions than the record's: it changed under the running job, and producing
        again cannot help. Otherwise (Kafka's answer was passing) return, to retry."""
        assert self._producer is not None
        try:
            metadata = self._producer.list_topics(missing.topic, timeout=_METADATA_TIMEOUT_S)
        except KafkaException:
            return
        found = metadata.topics.get(missing.topic)
        if found is None or found.error is not None:
            change = (
                f"topic {missing.topic!r} does not exist (deleted while the job ran?). Restart "
                "the job: it creates the topic (kafka.create_topics) or names it"
            )
        elif missing.partition is not None and missing.partition >= len(found.partitions):
            change = (
                f"topic {missing.topic!r} has {len(found.partitions)} partition(s) and the job "
                f"produces to its partition {missing.partition}: it was deleted and created "
                "again with fewer partitions while the job ran. Restart the job: it produces to "
                "the partitions the topic has now, and its reader says what the topic lost"
            )
        else:
            return
        self._discard_producer(missing)
        raise TopicError(f"producing the records of batch {batch_id} failed: {change}") from missing

    def _new_producer(self) -> Producer:
        """A producer on this unit's transactional id, transactions initialised."""
        # Only failed deliveries are reported: a callback per delivered record would cost
        # Python time per record, and a success needs no answer (flush tells what is left).
        settings = {
            **self._options,
            "transactional.id": self._transactional_id,
            "linger.ms": "20",
            "delivery.report.only.error": True,
        }
        producer = make_producer(self._bootstrap, settings, secret_options=self._secret_options)
        note_opened()
        # The control topic's metadata first, so that a broker connection is up when
        # init_transactions looks up the coordinator: asked before, librdkafka retries the
        # producer id request after 500 ms (5 of 12 takeovers of a unit by another worker
        # took 515-530 ms to init instead of 63-99; none of 12 with the metadata first).
        producer.list_topics(self._topic, timeout=_METADATA_TIMEOUT_S)
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
        self._known = False
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
    for current in causes(error):
        traceback.clear_frames(current.__traceback__)
