"""Key order (`retry.key_ordered`): while a record waits in a retry tier, the later records
of its key wait behind it, so a key's records are handled in the order they were read.

A key is a record key within one main-topic partition: Kafka orders records per partition,
and a keyed producer keeps a key in one partition. A key is blocked while it has records
waiting in the tiers; their origin offsets are its queue, and the lowest is its head. Only
the head (or a record of a key that is not blocked) reaches the handler. Any other record of
a blocked key is held: sent to the tier the head waits in, due when the head is, its
attempt unchanged. When the head is handled, skipped or dead-lettered it leaves the queue
and the next one becomes the head; an empty queue releases the key.

The router plans each batch so that a key's main-topic partition and the tier partitions
its retries go to are read by one task (`kafka.source`), which gets the queues of its
keys with its offset ranges. The task changes them in `KeyOrder` and returns the queues it
touched as result rows; the driver folds those into the job's state after the batch
(`key_order_store`), so the state moves with the batches and survives restarts.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from retrylib.record import Record

KEY_STATE_SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string(), nullable=False),  # the main topic
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("key", pa.binary(), nullable=False),
        pa.field("waiting", pa.list_(pa.int64()), nullable=False),  # empty: released
        pa.field("tier", pa.int32(), nullable=False),
        pa.field("not_before_ms", pa.int64(), nullable=False),
    ]
)
"""A key's queue as a task leaves it: the rows of `kind = "key_state"` (`results`)."""

KeyId = tuple[str, int, bytes]
"""A key: main topic, partition, record key."""


@dataclass
class Queue:
    """The records of one key waiting in the tiers: their origin offsets, lowest first, and
    the tier and time the head waits for (held records are sent there, due with it)."""

    offsets: list[int]
    tier: int
    not_before_ms: int

    @property
    def head(self) -> int:
        return self.offsets[0]


class KeyOrder:
    """The queues of one task's keys, and the task's decisions about them.

    `admit` is asked before each handler call, possibly from several lanes at once (a key's
    records stay in one lane, in order); the outcomes (`handled`, `retried`, `hold`) are
    applied afterwards from the task's thread, in the records' order.
    """

    def __init__(self) -> None:
        self.queues: dict[KeyId, Queue] = {}
        self._touched: set[KeyId] = set()
        self._failed_now: set[KeyId] = set()  # keys with a failed call not yet applied

    def load(self, payload: bytes) -> None:
        """Add the queues in `payload`: `queues_to_json`'s lists as JSON text."""
        self.queues.update(queues_from_json(json.loads(payload)))

    def admit(self, record: Record) -> bool:
        """True when `record` may be handled now: it has no key, its key is not blocked, or it
        is its key's head; False when it must be held."""
        key = key_of(record)
        if key is None:
            return True
        if key in self._failed_now:
            return False
        queue = self.queues.get(key)
        return queue is None or queue.head == record.offset

    def call_failed(self, record: Record) -> None:
        """`record`'s handler call failed: its key's later records in this task are held
        until the failure is applied (`retried` or `handled`)."""
        key = key_of(record)
        if key is not None:
            self._failed_now.add(key)

    def handled(self, record: Record) -> None:
        """`record` is done (handled, skipped or dead-lettered): it leaves its key's queue."""
        key = key_of(record)
        if key is None:
            return
        self._failed_now.discard(key)
        queue = self.queues.get(key)
        if queue is not None and record.offset in queue.offsets:
            queue.offsets.remove(record.offset)
            self._touched.add(key)
            if not queue.offsets:
                del self.queues[key]

    def retried(self, record: Record, tier: int, not_before_ms: int) -> None:
        """`record` failed and waits in `tier` until `not_before_ms`: its key is blocked,
        with it in the queue; a head that moves takes its queue's due time with it."""
        key = key_of(record)
        if key is None:
            return
        self._failed_now.discard(key)
        queue = self.queues.get(key)
        if queue is None:
            self.queues[key] = Queue([record.offset], tier, not_before_ms)
        else:
            if record.offset not in queue.offsets:
                queue.offsets.append(record.offset)
                queue.offsets.sort()
            if queue.head == record.offset:
                queue.tier, queue.not_before_ms = tier, not_before_ms
        self._touched.add(key)

    def hold(self, record: Record, now_ms: int) -> tuple[int, int]:
        """Queue `record` behind its key's head; returns the tier and due time to stage it
        with. A key whose head went to the dead letter in this task has no queue left: the
        record then heads a new one, in the first tier, due now."""
        key = key_of(record)
        assert key is not None, "a record without a key is never held"
        queue = self.queues.get(key)
        if queue is None:
            queue = self.queues[key] = Queue([], 0, now_ms)
        if record.offset not in queue.offsets:
            queue.offsets.append(record.offset)
            queue.offsets.sort()
        self._touched.add(key)
        return queue.tier, queue.not_before_ms

    def changes(self) -> pa.RecordBatch:
        """The touched keys' queues as `KEY_STATE_SCHEMA` rows (an empty queue: released)."""
        rows = []
        for key in sorted(self._touched):
            queue = self.queues.get(key)
            topic, partition, record_key = key
            rows.append(
                {
                    "topic": topic,
                    "partition": partition,
                    "key": record_key,
                    "waiting": [] if queue is None else queue.offsets,
                    "tier": 0 if queue is None else queue.tier,
                    "not_before_ms": 0 if queue is None else queue.not_before_ms,
                }
            )
        return pa.RecordBatch.from_pylist(rows, schema=KEY_STATE_SCHEMA)


def key_of(record: Record) -> KeyId | None:
    """The key `record` is ordered by (its origin's), or None for a record without a key."""
    if record.key is None:
        return None
    return (record.topic, record.partition, record.key)


def queues_to_json(queues: Iterable[tuple[KeyId, Queue]]) -> list:
    """`queues` as JSON-ready lists, keys in base64: how they travel and are kept."""
    return [
        [
            topic,
            partition,
            base64.b64encode(key).decode("ascii"),
            q.offsets,
            q.tier,
            q.not_before_ms,
        ]
        for (topic, partition, key), q in queues
    ]


def queues_from_json(entries: list) -> dict[KeyId, Queue]:
    """The queues `queues_to_json` gave."""
    return {
        (topic, partition, base64.b64decode(key)): Queue(list(offsets), tier, not_before)
        for topic, partition, key, offsets, tier, not_before in entries
    }


def apply_changes(queues: dict[KeyId, Queue], rows: Iterable[dict]) -> None:
    """Fold a batch's `KEY_STATE_SCHEMA` rows into `queues`: each replaces its key's queue,
    and an empty one releases the key."""
    for row in rows:
        key = (row["topic"], row["partition"], bytes(row["key"]))
        if row["waiting"]:
            queues[key] = Queue(list(row["waiting"]), row["tier"], row["not_before_ms"])
        else:
            queues.pop(key, None)


def read_queues(path: str) -> dict[KeyId, Queue]:
    """The queues in the local file at `path` (`write_queues`); none before it is written."""
    try:
        document = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return {}
    return queues_from_json(document["queues"])


def write_queues(path: Path, document: dict) -> None:
    """Replace the local file at `path` with `document` in one step: the source's planner
    may read it at any time."""
    draft = path.with_name(path.name + ".tmp")
    draft.parent.mkdir(parents=True, exist_ok=True)  # on a Spark Connect server, made here
    draft.write_text(json.dumps(document, separators=(",", ":")))
    os.replace(draft, path)
