"""The executor side of a delay router's micro-batch: each due record forwarded to the topic
it names, as Kafka-Retry-Router does.

A record on a delay topic (`[delay_router]`) names its destination in one header
(`final_topic`) and when it was sent, in epoch seconds, in another (`msg_ts`). The source
hands over the records whose Kafka timestamp is one delay old, or will be within the
router's read-ahead (`ForwardPlan.read_ahead_ms`: the task tells the batch when the last it
released is due, `results.NOT_BEFORE_MS`, and the batch's produce waits until then); each
then is:

- forwarded: sent on as it is (key, value, every header) to its destination, which must be
  a topic of the cluster other than Kafka's own "__" topics and retrylib's control topics
  ("_retrylib."), partitioned by its key;
- held: its `msg_ts` + delay is still ahead, past the read-ahead (the sender stamped it
  later than Kafka did):
  sent to its delay topic again, stamped so that the topic releases it when it is due;
- sent to the fallback topic when its destination is missing, not a topic, or one of the
  router's own delay topics (it would come back for ever), or when it was
  sent further ahead of the router's clock than `delay_router.max_timestamp_ahead` (it
  would never fall due), with the reason in `retrylib.dead_letter.reason` and
  `retrylib.error.message`;
- with no fallback topic, logged at ERROR and counted as `unroutable`.

A record with no readable `msg_ts` counts from its Kafka timestamp, and is counted. The
outgoing records go through the batch's Kafka transaction like the handler job's
(`batch.commit`), so each record is forwarded once.
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import pyarrow as pa

from retrylib.config.durations import format_duration
from retrylib.config.topic_names import CONTROL_TOPIC_PREFIX
from retrylib.kafka import worker_clients
from retrylib.kafka.arrow_records import RANGE_SCHEMA
from retrylib.kafka.reading import Reading, reading_options
from retrylib.logs import configure_worker_logging
from retrylib.retry.headers import DEAD_LETTER_REASON, ERROR_MESSAGE
from retrylib.retry.outcomes import Count, ForwardCount, Reason
from retrylib.retry.policy import due_time_ms, due_timestamp_ms
from retrylib.sinks.outgoing_records import OutgoingBuffer
from retrylib.source.range_reader import METADATA_TIMEOUT_S, KafkaInputPartition, read_messages
from retrylib.task.results import NOT_BEFORE_MS, OUTGOING_KIND, ResultRows

log = logging.getLogger(__name__)

_SECONDS = re.compile(rb"\s*([0-9]{1,12})(\.[0-9]*)?\s*")
Header = tuple[str, bytes | None]


@dataclass(frozen=True)
class ForwardPlan:
    """What a forwarding task needs, built on the driver; the batch commit sets the batch's id,
    clock and record limits."""

    job: str
    delays_ms: Mapping[str, int]  # delay topic -> delay
    target_header: str
    timestamp_header: str
    fallback_topic: str | None
    bootstrap_servers: str
    client_options: Mapping[str, str]
    secret_options: tuple[str, ...] = ()
    fail_on_data_loss: bool = True
    batch_id: int = -1
    now_ms: int = 0
    max_record_bytes: Mapping[str, int] = field(default_factory=dict)
    # Records due up to this long after `now_ms` are read in this batch; the batch produces
    # them once each is due (`results.NOT_BEFORE_MS`).
    read_ahead_ms: int = 0
    # A record sent further ahead of `now_ms` than this goes to the fallback topic.
    max_timestamp_ahead_ms: int = 3_600_000

    @property
    def output_schema(self) -> None:
        """A delay router writes no output table."""
        return None

    def isolated(self) -> None:
        """Forwarding runs no user code: there is nothing to run in a process of its own."""
        return None


@dataclass(frozen=True)
class Forward:
    topic: str


@dataclass(frozen=True)
class Hold:
    """Not due yet: back to its delay topic, with this Kafka timestamp."""

    timestamp_ms: int


@dataclass(frozen=True)
class NoDestination:
    reason: Reason
    message: str


def sent_at_ms(value: bytes | None) -> int | None:
    """Epoch milliseconds of a `msg_ts` header value (decimal epoch seconds, a fraction
    allowed), or None when it is missing or not such a number."""
    if value is None:
        return None
    match = _SECONDS.fullmatch(value)
    if match is None:
        return None
    fraction = match[2] or b"."
    return int(match[1]) * 1000 + int((fraction[1:] + b"000")[:3])


def destination(
    target: bytes | None, target_header: str, topics: Collection[str], read: Collection[str]
) -> Forward | NoDestination:
    """Where a record whose `target_header` holds `target` goes, given the cluster's
    `topics` and those the router `read`s (its delay topics)."""
    if target is None:
        return NoDestination(Reason.NO_FINAL_TOPIC, f"the record has no {target_header} header")
    name = target.decode("utf-8", errors="replace")
    if name.startswith(CONTROL_TOPIC_PREFIX):
        return NoDestination(
            Reason.CONTROL_FINAL_TOPIC,
            f"{target_header} {json.dumps(name)} is a retrylib control topic, which takes no "
            "forwarded records",
        )
    if name in read:
        return NoDestination(
            Reason.DELAY_FINAL_TOPIC,
            f"{target_header} {json.dumps(name)} is one of this router's delay topics: "
            "forwarded there, the record would come back to the router for ever",
        )
    if name not in topics or name.startswith("__"):
        return NoDestination(
            Reason.UNKNOWN_FINAL_TOPIC,
            f"{target_header} {json.dumps(name)} is not a topic of the cluster",
        )
    return Forward(name)


def too_far_ahead(sent_ms: int, plan: ForwardPlan) -> NoDestination | None:
    """A NoDestination when a record sent at `sent_ms` was sent further ahead of the batch's
    clock than `plan.max_timestamp_ahead_ms` (a sender's clock far off, seconds where
    milliseconds were meant, a forged stamp): held, it would go round its topic for ever."""
    ahead_ms = sent_ms - plan.now_ms
    if ahead_ms <= plan.max_timestamp_ahead_ms:
        return None
    bound = format_duration(plan.max_timestamp_ahead_ms)
    return NoDestination(
        Reason.TIMESTAMP_TOO_FAR_AHEAD,
        f"{plan.timestamp_header} is {format_duration(ahead_ms)} ahead of the router's clock, "
        f"more than delay_router.max_timestamp_ahead ({bound})",
    )


def hold(sent_ms: int, delay_ms: int, now_ms: int, read_ahead_ms: int = 0) -> Hold | None:
    """A Hold when a record sent at `sent_ms` to a topic of delay `delay_ms` is not due by
    `now_ms` + `read_ahead_ms`, else None.

    Its new Kafka timestamp makes the topic release it when due, and is never later than
    `now_ms`: brokers refuse records stamped too far ahead, and a record stamped later than
    its neighbours holds up every record behind it. A sender's clock that runs ahead so
    costs one more round per delay, until it is due.
    """
    due_ms = due_time_ms(sent_ms, delay_ms)
    if due_ms <= now_ms + read_ahead_ms:
        return None
    return Hold(min(due_timestamp_ms(due_ms, delay_ms), now_ms))


class ForwardingTask:
    """Forwards the records of one task; see the module docstring."""

    def __init__(self, plan: ForwardPlan) -> None:
        self.plan = plan
        self.results = ResultRows(None)
        self.counters: Counter[str] = Counter()
        self._outgoing = OutgoingBuffer()
        self._topics: frozenset[str] | None = None
        self._fallback_example: str | None = None
        self._unstamped_example: str | None = None
        self._clients_before = worker_clients.opened()
        self._last_due_ms = 0  # of the records released: the batch produces once it has passed

    def forward_range(self, topic: str, partition: int, start: int, end: int) -> None:
        """Read offsets `start` to `end` (exclusive) of delay topic `topic[partition]` and
        forward, hold or set aside each record."""
        plan = self.plan
        part = KafkaInputPartition(
            topic,
            partition,
            start,
            end,
            plan.bootstrap_servers,
            reading_options(plan.client_options, Reading.DELAYED_TOPICS),
            plan.secret_options,
            plan.fail_on_data_loss,
        )
        delay_ms = plan.delays_ms[topic]
        for messages in read_messages(part, self.count_lost):
            self.counters[ForwardCount.RECORDS_DELAYED] += len(messages)
            for message in messages:
                headers = message.headers() or []
                where = f"{topic}[{partition}]@{message.offset()}"
                sent_ms = sent_at_ms(_header(headers, plan.timestamp_header))
                if sent_ms is None:
                    self.counters[ForwardCount.TIMESTAMP_HEADER_MISSING] += 1
                    self._unstamped_example = self._unstamped_example or where
                    sent_ms = message.timestamp()[1]
                too_far = too_far_ahead(sent_ms, plan)
                if too_far is not None:
                    self._set_aside(where, message, headers, too_far)
                    continue
                held = hold(sent_ms, delay_ms, plan.now_ms, plan.read_ahead_ms)
                if held is not None:
                    self.counters[Count.REQUEUED_NOT_DUE] += 1
                    self._add_outgoing(topic, partition, held.timestamp_ms, message, headers)
                    continue
                due_ms = due_time_ms(sent_ms, delay_ms)
                self._last_due_ms = max(self._last_due_ms, due_ms)
                target = destination(
                    _header(headers, plan.target_header),
                    plan.target_header,
                    self._cluster(),
                    plan.delays_ms,
                )
                if isinstance(target, Forward):
                    self.counters[ForwardCount.FORWARDED] += 1
                    # Stamped when it is produced at the earliest: one read ahead, when due.
                    stamp_ms = max(plan.now_ms, due_ms)
                    self._add_outgoing(target.topic, None, stamp_ms, message, headers)
                else:
                    self._set_aside(where, message, headers, target)
            self._hand_over()

    def _set_aside(self, where: str, message, headers: list[Header], why: NoDestination) -> None:
        """A record with no destination: to the fallback topic, or logged and counted."""
        fallback = self.plan.fallback_topic
        if fallback is None:
            self.counters[ForwardCount.UNROUTABLE] += 1
            log.error(
                "%s not forwarded: %s, and delay_router.fallback_topic is not set; "
                "counted as unroutable (%s)",
                where,
                why.message,
                why.reason,
            )
            return
        self.counters[ForwardCount.FORWARDED_TO_FALLBACK] += 1
        self._fallback_example = self._fallback_example or f"{where}: {why.message}"
        reasons = [
            (DEAD_LETTER_REASON, str(why.reason).encode()),
            (ERROR_MESSAGE, why.message.encode("utf-8")),
        ]
        self._add_outgoing(fallback, None, self.plan.now_ms, message, [*headers, *reasons])

    def _cluster(self) -> frozenset[str]:
        """The cluster's topics, looked up once per task with a consumer the Python worker
        keeps (`worker_clients`)."""
        if self._topics is None:
            plan = self.plan
            with worker_clients.kept_consumer(
                plan.bootstrap_servers, plan.client_options, secret_options=plan.secret_options
            ) as consumer:
                self._topics = frozenset(consumer.list_topics(timeout=METADATA_TIMEOUT_S).topics)
        return self._topics

    def count_lost(self, records: int) -> None:
        """Count `records` as lost: deleted from Kafka before they were read."""
        self.counters[Count.RECORDS_LOST] += records

    def _add_outgoing(
        self, topic: str, partition: int | None, timestamp_ms: int, message, headers: list
    ) -> None:
        self._outgoing.add(topic, partition, timestamp_ms, message.key(), message.value(), headers)

    def _hand_over(self) -> None:
        outgoing = self._outgoing.take()
        if outgoing is not None:
            self.results.add(OUTGOING_KIND, outgoing)

    def finish(self) -> Iterator[pa.RecordBatch]:
        """Yields the outgoing records not yet handed over and the task's counters row, which
        says when the last record it released is due (`results.NOT_BEFORE_MS`): one read
        ahead may not be yet. The batch's staging, manifest and produce tasks then overlap
        the wait, and the produce waits out the rest."""
        self._hand_over()
        if self._fallback_example is not None:
            log.warning(
                "%d record(s) sent to fallback topic %s, the first %s",
                self.counters[ForwardCount.FORWARDED_TO_FALLBACK],
                self.plan.fallback_topic,
                self._fallback_example,
            )
        if self._unstamped_example is not None:
            log.warning(
                "%d record(s) without a readable %s header (epoch seconds) counted their "
                "delay from their Kafka timestamp, the first %s",
                self.counters[ForwardCount.TIMESTAMP_HEADER_MISSING],
                self.plan.timestamp_header,
                self._unstamped_example,
            )
        opened = worker_clients.opened() - self._clients_before
        if opened:
            self.counters[Count.KAFKA_CLIENTS_OPENED] = opened
        yield from self.results.drain()
        payload = dict(self.counters)
        if self._last_due_ms > self.plan.now_ms:
            payload[NOT_BEFORE_MS] = self._last_due_ms
        yield self.results.counters(json.dumps(payload))


def _header(headers: Sequence[Header], name: str) -> bytes | None:
    """The value of the last header `name` (the latest a producer added), or None."""
    for key, value in reversed(headers):
        if key == name:
            return value
    return None


def run_forwarding_task(
    plan: ForwardPlan, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """The `mapInArrow` body of a delay router: forward the records of the offset ranges
    (`RANGE_SCHEMA`) of this task, yielding the result rows (`retrylib.task.results`) as they are
    decided and its counters at the end."""
    configure_worker_logging()
    task = ForwardingTask(plan)
    for batch in batches:
        if batch.schema.names != RANGE_SCHEMA.names:
            raise TypeError(f"a delay router reads offset ranges, got {batch.schema.names}")
        for topic, partition, start, end, lost in zip(
            *(column.to_pylist() for column in batch.columns), strict=True
        ):
            if lost:
                task.count_lost(lost)
            if start < end:
                task.forward_range(topic, partition, start, end)
        yield from task.results.drain()
    yield from task.finish()
