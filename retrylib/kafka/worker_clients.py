"""Kafka clients kept by a Python worker across the tasks and batches it runs.

Spark reuses its Python workers (`spark.python.worker.reuse`, on by default), so a client
made for one task can serve the next: a consumer is re-assigned to each offset range it
reads, a transactional producer keeps its id and its warm connections. Opening a client
costs connections, a metadata round trip and, for a transactional producer, a coordinator
look-up; a batch over many partitions would pay it once per range without this.

Clients are keyed by their whole configuration (a consumer) or their transactional id (a
producer, which serves one id for its life). Each kind is bounded: past `MAX_CONSUMERS` or
`MAX_PRODUCERS` the least recently used one is closed. A consumer is handed to one caller
at a time and comes back clean (unassigned); one whose block raised is closed instead.
`opened()` counts the clients this process made, for the batch's counters. Spark ends a
reused worker with `os._exit` or SIGKILL, so no Python hook runs then: the sockets close
with the process, and no client is left holding anything on the broker (a producer's
transaction is committed or aborted before its task returns; the consumers join no group).
A process that exits normally (a driver, a test run) closes its kept consumers at exit.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Generic, TypeVar

from confluent_kafka import Consumer

from retrylib.kafka.clients import make_consumer

MAX_CONSUMERS = 4
MAX_PRODUCERS = 8
C = TypeVar("C")

_lock = threading.Lock()
_opened = 0


def opened() -> int:
    """How many Kafka clients this process has opened through this module."""
    return _opened


def note_opened() -> None:
    """Count one client opened by this process (`opened`)."""
    global _opened
    with _lock:
        _opened += 1


class Pool(Generic[C]):
    """Clients by key, the least recently used closed past `limit`."""

    def __init__(self, limit: int, close: Callable[[C], None]) -> None:
        self._limit = limit
        self._close = close
        self._clients: OrderedDict[object, C] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, key: object, make: Callable[[], C]) -> C:
        """The client kept under `key`, taken out of the pool (`give` puts it back), or a
        new one from `make`. A taken client is used by one caller at a time."""
        with self._lock:
            client = self._clients.pop(key, None)
        return make() if client is None else client

    def give(self, key: object, client: C) -> None:
        """Keep `client` under `key` for the next `take`; closes the least recently used
        client past the limit (or one already kept under `key`)."""
        evicted: list[C] = []
        with self._lock:
            previous = self._clients.pop(key, None)
            if previous is not None:
                evicted.append(previous)
            self._clients[key] = client
            while len(self._clients) > self._limit:
                evicted.append(self._clients.popitem(last=False)[1])
        for old in evicted:
            with contextlib.suppress(Exception):
                self._close(old)

    def clear(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), OrderedDict()
        for client in clients:
            with contextlib.suppress(Exception):
                self._close(client)


def _consumer_key(
    bootstrap_servers: str, options: Mapping[str, str], secret_options: Collection[str]
) -> tuple:
    return (bootstrap_servers, tuple(sorted(options.items())), tuple(sorted(secret_options)))


_consumers: Pool[Consumer] = Pool(MAX_CONSUMERS, lambda consumer: consumer.close())


@contextlib.contextmanager
def kept_consumer(
    bootstrap_servers: str,
    options: Mapping[str, str],
    *,
    secret_options: Collection[str] = (),
) -> Iterator[Consumer]:
    """A consumer for explicit `assign()` reads (`clients.make_consumer`), kept for the next
    caller with the same settings (`options` whole: a read's own settings are part of it).

    It comes with no assignment and is unassigned when the block ends. A block that raises,
    or is left part-way (a reading generator closed before its end), closes it instead: its
    state is unknown. So does an unassign that fails.
    """
    key = _consumer_key(bootstrap_servers, options, secret_options)

    def make() -> Consumer:
        consumer = make_consumer(bootstrap_servers, options, secret_options=secret_options)
        note_opened()
        return consumer

    consumer = _consumers.take(key, make)
    try:
        yield consumer
    except BaseException:
        _close_quietly(consumer)
        raise
    try:
        consumer.unassign()
    except Exception:
        _close_quietly(consumer)
        return
    _consumers.give(key, consumer)


def _close_quietly(consumer: Consumer) -> None:
    with contextlib.suppress(Exception):
        consumer.close()


def close_all() -> None:
    """Close every kept consumer (tests, and a worker that wants to let go)."""
    _consumers.clear()


atexit.register(close_all)
