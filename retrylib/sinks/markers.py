"""Produce markers: the records in a job's control topic that say a unit of a batch was
produced.

Executors produce a batch's outgoing records in units (`produce_units`), each in one Kafka
transaction that also writes the unit's marker to partition 0 of the job's control topic
(`config.topics.produced_topic`): key = the checkpoint's app id, value =
"<batch>:<unit>:<signature>". The signature is an HMAC of the app id, batch and unit under the
checkpoint's signing key, so a record someone else wrote to the control topic (a forwarded
record, a stray producer) is never taken for a marker: it could otherwise make the job skip
a batch's records, or refuse to start.

- `unit_produced` answers, on an executor, whether one unit of one batch has a committed
  marker, reading from the offset the batch recorded before any of its produce began.
- `ControlTopic` serves the driver: the offset a batch's markers will come after, and the
  highest batch this checkpoint ever produced (a query that runs an older batch runs from an
  older copy of the checkpoint).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import time
from collections.abc import Mapping

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from retrylib.errors import MarkerReadError
from retrylib.kafka.clients import make_consumer
from retrylib.kafka.reading import (
    WATERMARK_TIMEOUT_S,
    Reading,
    arrived,
    last_marker,
    reading_options,
)
from retrylib.kafka.worker_clients import kept_consumer

_SIGNATURE_CHARS = 32
MARKER_READ_TIMEOUT_S = 120.0
"""How long `unit_produced` waits for open transactions before the end to resolve."""


def _signature(signing_key: bytes, app_id: str, batch_id: int, unit: int) -> str:
    text = f"retrylib-marker\0{app_id}\0{batch_id}\0{unit}".encode()
    return hmac.new(signing_key, text, hashlib.sha256).hexdigest()[:_SIGNATURE_CHARS]


def marker_value(signing_key: bytes, app_id: str, batch_id: int, unit: int) -> bytes:
    """The value of unit `unit`'s marker for batch `batch_id` of app id `app_id`."""
    return f"{batch_id}:{unit}:{_signature(signing_key, app_id, batch_id, unit)}".encode()


def read_marker(
    signing_key: bytes, app_id: str, key: bytes | None, value: bytes | None
) -> tuple[int, int] | None:
    """(batch, unit) of a control-topic record that is a marker of app id `app_id`
    signed with `signing_key`, else None."""
    if key != app_id.encode() or value is None:
        return None
    parts = value.split(b":")
    if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit():
        return None
    batch_id, unit = int(parts[0]), int(parts[1])
    expected = _signature(signing_key, app_id, batch_id, unit).encode()
    return (batch_id, unit) if hmac.compare_digest(expected, parts[2]) else None


def _watermarks(
    bootstrap_servers: str, options: Mapping[str, str], topic: str, secret_options: tuple[str, ...]
) -> tuple[int, int]:
    """Partition 0 of `topic`: its log start, and its high watermark now (past every record
    appended, committed or not). A read_committed consumer's watermark is the last stable
    offset, which stops short of a marker committed after another transaction opened."""
    with kept_consumer(
        bootstrap_servers,
        reading_options(options, Reading.HIGH_WATERMARK),
        secret_options=secret_options,
    ) as consumer:
        return consumer.get_watermark_offsets(
            TopicPartition(topic, 0), timeout=WATERMARK_TIMEOUT_S, cached=False
        )


def unit_produced(
    bootstrap_servers: str,
    options: Mapping[str, str],
    topic: str,
    *,
    signing_key: bytes,
    app_id: str,
    batch_id: int,
    unit: int,
    since: int,
    secret_options: tuple[str, ...] = (),
    timeout_s: float = MARKER_READ_TIMEOUT_S,
) -> bool:
    """True when `topic` holds a committed marker of (`batch_id`, `unit`).

    Only offsets from `since` are read (every marker of the batch comes after it; a topic
    that restarted below it is read whole). The read goes on until every offset below the
    high watermark is settled, so a marker committed behind a transaction still open is not
    missed. The caller has initialised the unit's transactional id first, which settles that
    id's own transaction. Raises `KafkaException`, or `MarkerReadError` past `timeout_s`.
    """
    low, high = _watermarks(bootstrap_servers, options, topic, secret_options)
    start = since if low <= since <= high else low
    if start >= high:
        return False
    with kept_consumer(
        bootstrap_servers, reading_options(options, Reading.TO_END), secret_options=secret_options
    ) as consumer:
        consumer.assign([TopicPartition(topic, 0, start)])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for message in arrived(consumer, 500, 0.1):
                error = message.error()
                if error is not None and error.code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(error)
                if error is None and read_marker(
                    signing_key, app_id, message.key(), message.value()
                ) == (batch_id, unit):
                    return True
                # A record settles its own offset; the partition's end, every one before it.
                settled = message.offset() + 1 if error is None else message.offset()
                if settled >= high:
                    return False
    raise MarkerReadError(
        f"reading {topic} offsets {start}..{high} for the marker of batch {batch_id} unit "
        f"{unit}: not settled in {timeout_s:.0f}s (a transaction left open?)"
    )


class ControlTopic:
    """The driver's view of a job's control topic (one partition)."""

    def __init__(
        self,
        bootstrap_servers: str,
        options: Mapping[str, str],
        topic: str,
        *,
        signing_key: bytes,
        app_id: str,
        secret_options: tuple[str, ...] = (),
    ) -> None:
        self.topic = topic
        self._bootstrap = bootstrap_servers
        self._options = dict(options)
        self._secret_options = secret_options
        self._signing_key = signing_key
        self._app_id = app_id

    def end_offset(self) -> int:
        """The partition's high watermark now: every marker produced later is at or past it."""
        return _watermarks(self._bootstrap, self._options, self.topic, self._secret_options)[1]

    def last_produced_batch(self) -> int | None:
        """The highest batch with a committed, signed marker of this checkpoint, or None.

        Raises `KafkaException` or `MarkerReadError` when the topic cannot be read to its end.
        """
        consumer = make_consumer(
            self._bootstrap,
            reading_options(self._options, Reading.TO_END),
            secret_options=self._secret_options,
        )
        try:
            return last_marker(consumer, self.topic, self._batch_of)
        finally:
            with contextlib.suppress(Exception):
                consumer.close()

    def _batch_of(self, message: Message) -> int | None:
        marker = read_marker(self._signing_key, self._app_id, message.key(), message.value())
        return None if marker is None else marker[0]
