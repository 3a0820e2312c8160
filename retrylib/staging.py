"""Records bound for Kafka (retry tiers, dead-letter topic), staged in Parquet, produced once.

Executors decide what to send and stage it in Parquet files; the driver produces a batch's
staged records in one Kafka transaction that also writes a marker (the batch id) to the
job's control topic. A replayed batch finds the marker and produces nothing again, and
readers use read_committed, so a crash mid-produce leaves no visible half.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

import pyarrow as pa
import pyarrow.parquet as pq
from confluent_kafka import KafkaException, TopicPartition

from retrylib.dead_letter import HEADERS_TYPE
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

_MARKER_LOOKBACK = 20


def control_topic(job_name: str) -> str:
    """The one-partition topic holding the id of each batch whose records were produced."""
    return f"_retrylib.{job_name}.produced"


class StagedProducer:
    """Produces a batch's staged records exactly once (see the module docstring).

    Uses a transactional producer with `transactional.id` derived from the job name, so a
    restarted job fences off a zombie instance of itself.
    """

    def __init__(self, job_name: str, bootstrap: str, options: Mapping[str, str]) -> None:
        self._job = job_name
        self._bootstrap = bootstrap
        self._options = dict(options)
        self._topic = control_topic(job_name)
        self._producer = make_producer(
            bootstrap,
            {**self._options, "transactional.id": f"retrylib-{job_name}", "linger.ms": "20"},
        )
        self._producer.init_transactions(30)

    def last_produced_batch(self) -> int | None:
        """The highest batch id with a committed marker, or None."""
        consumer = make_consumer(
            self._bootstrap, {**self._options, "isolation.level": "read_committed"}
        )
        try:
            low, high = consumer.get_watermark_offsets(TopicPartition(self._topic, 0), 15)
            if high <= low:
                return None
            consumer.assign([TopicPartition(self._topic, 0, max(low, high - _MARKER_LOOKBACK))])
            batches: list[int] = []
            for message in consumer.consume(_MARKER_LOOKBACK, timeout=5):
                if message.error() is None:
                    batches.append(int(message.value()))
            return max(batches, default=None)
        finally:
            consumer.close()

    def produce_once(self, batch_id: int, staged_files: Iterable[str]) -> int:
        """Produce the records in `staged_files` for `batch_id` unless already done.

        Returns the number of records produced (0 when the marker shows they were). Raises
        `KafkaException` when the transaction fails; the batch then fails and is replayed.
        """
        done = self.last_produced_batch()
        if done is not None and done >= batch_id:
            log.info("records of batch %d were produced before; skipped", batch_id)
            return 0
        self._producer.begin_transaction()
        try:
            count = sum(self._produce_file(path) for path in staged_files)
            self._producer.produce(self._topic, value=str(batch_id).encode(), partition=0)
            self._producer.commit_transaction(60)
        except KafkaException:
            self._producer.abort_transaction(30)
            raise
        return count

    def _produce_file(self, path: str) -> int:
        count = 0
        fs, local = filesystem(path)
        for batch in pq.ParquetFile(local, filesystem=fs).iter_batches(batch_size=5000):
            for row in batch.to_pylist():
                self._produce(row)
                count += 1
        return count

    def _produce(self, row: dict) -> None:
        headers = [(h["key"], h["value"]) for h in row["headers"] or ()]
        while True:
            try:
                self._producer.produce(
                    row["topic"],
                    key=row["key"],
                    value=row["value"],
                    headers=headers,
                    partition=row["partition"],
                    timestamp=row["timestamp_ms"],
                )
                return
            except BufferError:  # local queue full: let deliveries drain, then try again
                self._producer.poll(0.1)

    def close(self) -> None:
        self._producer.flush(30)
