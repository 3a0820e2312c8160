"""The exception tree of retrylib, and the exceptions a handler raises to steer retries.

Everything retrylib itself detects is a `RetrylibError`. The failures a handler call ends in
(`handler.HandlerTimeout`, `BadHandlerResult`, `HandlerRaisedBaseException`, `HandlerCrashed`)
stay in `handler.py`: they stand for the handler's own failure, not retrylib's, and their
qualified names are what dead letters record as the error class.
"""

from __future__ import annotations

from collections.abc import Iterator


class RetrylibError(Exception):
    """Raised for any failure that retrylib itself detects (never for handler failures)."""


class ConfigError(RetrylibError):
    """Raised when a job config is missing a key, has an unknown key or an invalid value."""


class TopicError(RetrylibError):
    """Raised when a topic the job needs is missing and the job may not create it, or its
    settings cannot be read or leave no room for retrylib's records."""


class TableWriteError(RetrylibError):
    """Raised when Spark cannot append a batch to one of the job's Delta tables."""


class JarsError(RetrylibError):
    """Raised when Maven is missing or cannot resolve the jars."""


class KafkaConnectError(RetrylibError):
    """Raised when the Kafka brokers refuse the job's login or none of them answers."""


class KafkaSourceError(RetrylibError):
    """Raised when reading Kafka fails: broker errors, missing partitions, a stalled read."""


class ProduceError(RetrylibError):
    """Raised when a batch's outgoing records could not be produced (after retrying)."""


class RecordTooLargeError(ProduceError):
    """Raised when Kafka refuses an outgoing record as too large; retrying cannot help."""


class MarkerReadError(RetrylibError):
    """Raised when a control topic could not be read to the end in time."""


class LeaseHeld(RetrylibError):
    """Raised when another copy of the job (or of its redrive) holds the lease to run it."""


class RedriveError(RetrylibError):
    """Raised when a redrive cannot start or its send fails (nothing is marked as sent)."""


class UnverifiedRetryRecord(RetrylibError):
    """Raised when a record on a retry topic is not signed with the job's key."""


class CorruptRetryHeaders(ValueError):
    """Raised when a record on a retry topic has missing or unreadable retry headers."""


class NonRetryable(Exception):
    """Raised by a handler to send the record straight to the dead letter, skipping retries.

    For data no retry can fix:

    >>> import json
    >>> from retrylib import NonRetryable, Record
    >>> def enrich_order(record: Record) -> dict:
    ...     order = json.loads(record.value)
    ...     if order["total"] < 0:
    ...         raise NonRetryable(f"negative total {order['total']}")
    ...     return {"order_id": order["id"], "total": order["total"]}
    >>> enrich_order(Record(b"o-7", b'{"id": "o-7", "total": -5}', [], "orders", 0, 7, 0))
    Traceback (most recent call last):
    ...
    retrylib.errors.NonRetryable: negative total -5
    """


class Skip(Exception):
    """Raised by a handler to drop the record: no output, no retry, no dead letter.

    The record is counted (`skipped_by_handler`) and logged with the message, never silent.
    For a record the job should not handle, such as a test order:

    >>> from retrylib import Record, Skip
    >>> def enrich_order(record: Record) -> dict:
    ...     if dict(record.headers).get("test") == b"true":
    ...         raise Skip("test order")
    ...     return {"order_id": record.key.decode()}
    >>> enrich_order(Record(b"o-8", b"{}", [("test", b"true")], "orders", 0, 8, 0))
    Traceback (most recent call last):
    ...
    retrylib.errors.Skip: test order
    """


class RetryAfter(Exception):
    """Raised by a handler to ask for the record to be retried no sooner than `seconds` from now.

    The record still counts an attempt; out of attempts, it goes to the dead letter as usual.
    For a service that says when to come back, such as an HTTP 429 (rate limited):

    >>> from retrylib import Record, RetryAfter
    >>> def fetch_price(sku: bytes) -> tuple[int, float | None]:  # stands in for an HTTP call
    ...     return 429, None
    >>> def price_order(record: Record) -> dict:
    ...     status, price = fetch_price(record.key)
    ...     if status == 429:
    ...         raise RetryAfter(30, "price service rate limit")
    ...     return {"sku": record.key.decode(), "price": price}
    >>> price_order(Record(b"sku-9", b"{}", [], "orders", 0, 9, 0))
    Traceback (most recent call last):
    ...
    retrylib.errors.RetryAfter: price service rate limit

    The job reads `seconds`; without a message, the error says them:

    >>> RetryAfter(30).seconds, str(RetryAfter(30))
    (30.0, 'retry after 30s')
    """

    def __init__(self, seconds: float, message: str = "") -> None:
        if seconds < 0:
            raise ValueError(f"RetryAfter seconds must be >= 0, got {seconds!r}")
        super().__init__(message or f"retry after {seconds}s")
        self.seconds = float(seconds)


class DamagedFile(RetrylibError, ValueError):
    """Raised when a file of the job's checkpoint is there but cannot be read as what it
    holds (a write cut short, a bad copy). `uri` names it, `reason` says what is wrong."""

    def __init__(self, uri: str, reason: str) -> None:
        super().__init__(
            f"{uri} is damaged ({reason}): restore it from a backup, or start the job from a "
            "new checkpoint (job.checkpoint)"
        )
        self.uri = uri
        self.reason = reason


def causes(error: BaseException | None) -> Iterator[BaseException]:
    """`error`, then what it was raised from or during, and so on (each once: a chain that
    loops back ends where it would repeat)."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__
