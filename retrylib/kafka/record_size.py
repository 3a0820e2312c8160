"""How many bytes a record takes on the wire, and cutting a dead-letter record to a limit.

Pure decisions, no Kafka client: the driver looks up each destination topic's limit once per
batch (`kafka.clients.RecordLimits`) and ships it in the task plan; the task sizes every
retry and dead-letter record with `wire_size` before staging it, so a record no topic would
accept never reaches the producer (where it would fail the batch, and every replay of it).

Sizes follow Kafka's record batch format (v2). The estimate is an upper bound: each record
is counted as if alone in its batch (the full batch header), and every varint at its widest.
Measured on Apache Kafka 4.1 with librdkafka: the broker took a 199,920-byte value alone in
a topic whose `max.message.bytes` is 200,000 (80 bytes of framing at most) and librdkafka's
own check allows value + key + headers + 36 up to `message.max.bytes`; `wire_size` counts
97 bytes of framing plus 10 per header, so it errs by a few dozen bytes on the safe side.
Compression does not help a record past the limit: librdkafka sends a batch uncompressed
when compressing would not make it smaller, and a random value does not compress.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from retrylib.errors import ConfigError
from retrylib.retry.headers import (
    HEADERS_DROPPED,
    KEY_TRUNCATED,
    RESERVED,
    SIGNATURE,
    VALUE_TRUNCATED,
    Header,
    signature_length,
)

BATCH_OVERHEAD_BYTES = 61
"""Kafka's record batch header: base offset, length, leader epoch, magic, CRC, attributes,
last offset delta, two timestamps, producer id and epoch, base sequence, record count."""
RECORD_OVERHEAD_BYTES = 36
"""One record's framing with every varint at its widest: length (5), attributes (1),
timestamp delta (10), offset delta (5), key length (5), value length (5), header count (5)."""
HEADER_OVERHEAD_BYTES = 10
"""One header's framing: name length and value length, varints at their widest (5 + 5)."""
SIGNATURE_BYTES = HEADER_OVERHEAD_BYTES + len(SIGNATURE) + signature_length()
"""What `headers.sign` adds to a record: outgoing records are sized before they are signed."""

LIBRDKAFKA_MESSAGE_MAX_BYTES = 1_000_000
"""librdkafka's default `message.max.bytes`, the largest record its producer accepts."""
LIBRDKAFKA_BATCH_BYTES = 1_000_000
"""librdkafka's default `batch.size`, the most bytes of records it puts in one batch."""

MIN_RECORD_LIMIT_BYTES = 16 * 1024
"""The smallest limit retrylib works with: room for its own dead-letter headers (error
class and message up to 2,048 bytes each, stack trace up to 8,192, the rest about 1 KB),
the truncation markers and the framing, with a value, key and headers cut to nothing."""


@dataclass(frozen=True)
class Fitted:
    """A record cut to fit a limit: what is produced, and its size before and after."""

    key: bytes | None
    value: bytes | None
    headers: list[Header]
    original_bytes: int
    bytes: int

    @property
    def cut(self) -> bool:
        """True when anything was cut (a marker header then says what)."""
        return self.bytes != self.original_bytes


def wire_size(key: bytes | None, value: bytes | None, headers: Sequence[Header]) -> int:
    """Upper bound of the bytes a record takes in Kafka alone in its batch (see module)."""
    size = BATCH_OVERHEAD_BYTES + RECORD_OVERHEAD_BYTES + len(key or b"") + len(value or b"")
    for name, header_value in headers:
        # An ASCII name (every one of retrylib's) is as long in UTF-8: not encoded to count.
        name_bytes = len(name) if name.isascii() else len(name.encode("utf-8"))
        size += HEADER_OVERHEAD_BYTES + name_bytes + len(header_value or b"")
    return size


def producer_limit(options: Mapping[str, str]) -> int:
    """The largest record retrylib's producer accepts: `message.max.bytes` in the Kafka
    options the job passes to its clients, else librdkafka's default.

    Raises `ConfigError` naming the option when it is not a whole number.
    """
    return _whole_number(options, "message.max.bytes", LIBRDKAFKA_MESSAGE_MAX_BYTES)


def producer_batch_bytes(
    options: Mapping[str, str], topic_max_bytes: Mapping[str, int]
) -> int | None:
    """The `batch.size` retrylib's producer needs so that no batch passes a topic's
    `max.message.bytes` (`topic_max_bytes`, per topic), or None when the configured (or
    default) one is small enough.

    librdkafka fills a batch up to `batch.size` whatever the topic accepts, and the broker
    refuses a whole batch over the topic's `max.message.bytes` (three 90,000-byte records
    were refused together by a topic of 200,000, measured). Room is left for the batch
    header. Raises `ConfigError` naming the option when it is not a
    whole number.
    """
    if not topic_max_bytes:
        return None
    configured = _whole_number(options, "batch.size", LIBRDKAFKA_BATCH_BYTES)
    needed = min(topic_max_bytes.values()) - BATCH_OVERHEAD_BYTES
    return needed if needed < configured else None


def largest_record(producer_max_bytes: int, topic_max_bytes: int) -> int:
    """The largest record (as `wire_size` counts) that both the producer and the topic take."""
    return min(producer_max_bytes, topic_max_bytes)


def fit(key: bytes | None, value: bytes | None, headers: Sequence[Header], limit: int) -> Fitted:
    """The record cut down so that `wire_size` is at most `limit`, marking what was cut.

    In order, until it fits: the value is cut short (header `retrylib.value_truncated`, its
    original length in bytes); the record's own headers (not reserved ones) are dropped from
    the last one backwards (`retrylib.headers_dropped`, how many); the key is cut short
    (`retrylib.key_truncated`, its original length). retrylib's headers are never cut. A
    record that fits is returned unchanged.

    Raises `ValueError` when retrylib's headers alone do not fit, which a limit of at least
    `MIN_RECORD_LIMIT_BYTES` rules out.
    """
    original = wire_size(key, value, headers)
    if original <= limit:
        return Fitted(key, value, list(headers), original, original)
    user = [h for h in headers if h[0] not in RESERVED]
    own = [h for h in headers if h[0] in RESERVED]
    markers: list[Header] = []
    if value:
        markers.append((VALUE_TRUNCATED, str(len(value)).encode()))
        room = limit - wire_size(key, None, [*user, *own, *markers])
        if room >= 0:
            return _fitted(key, value[:room], [*user, *own, *markers], original)
        value = b""
    for dropped in range(1, len(user) + 1):
        marked = [*markers, (HEADERS_DROPPED, str(dropped).encode())]
        kept = [*user[: len(user) - dropped], *own, *marked]
        if wire_size(key, value, kept) <= limit:
            return _fitted(key, value, kept, original)
    if user:
        markers.append((HEADERS_DROPPED, str(len(user)).encode()))
    if key:
        markers.append((KEY_TRUNCATED, str(len(key)).encode()))
        room = limit - wire_size(None, value, [*own, *markers])
        if room >= 0:
            return _fitted(key[:room], value, [*own, *markers], original)
    raise ValueError(
        f"retrylib's own headers take {wire_size(None, None, [*own, *markers])} bytes, "
        f"more than the limit of {limit} bytes"
    )


def _fitted(key: bytes | None, value: bytes | None, headers: list[Header], original: int):
    return Fitted(key, value, headers, original, wire_size(key, value, headers))


def _whole_number(options: Mapping[str, str], name: str, default: int) -> int:
    raw = options.get(name)
    if raw is None:
        return default
    try:
        return int(str(raw).strip())
    except ValueError as e:
        raise ConfigError(
            f'kafka.options: {name!r} must be a whole number of bytes, e.g. "1000000", got {raw!r}'
        ) from e
