"""The `retrylib_kafka` source's Kafka look-ups on the driver: the partitions of the
subscribed topics, offsets by time (asked again while the cluster settles), and reads of a
delay tier's short tails and of the timestamps behind a record stamped ahead.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from retrylib.errors import KafkaSourceError, TopicError
from retrylib.kafka.clients import make_consumer, topic_partitions
from retrylib.kafka.offsets import FrontierScan, Offsets, PartitionKey
from retrylib.kafka.reading import Reading, ReadToEnd, reading_options
from retrylib.logs import redact
from retrylib.source.options import SourceOptions
from retrylib.source.range_reader import METADATA_TIMEOUT_S

log = logging.getLogger(__name__)

_RETRY_PAUSE_S = 0.2  # between asks for offsets the broker could not give yet
_TAIL_READ_S = 2.0
"""How long the driver reads delay tiers' short not-yet-due tails for records
(`holding_records`): one fetch of a few offsets from each, which a broker answers in
milliseconds; and at most how long it reads timestamps behind a record stamped ahead
(`scan_timestamps`)."""
_SCAN_RECORDS = 100_000
"""The most records read for their timestamps at one look (`scan_timestamps`); the rest
are read at the next. Each is read there once, as it falls due."""

# Answers to an offset look-up that pass once the cluster settles: a partition's leader
# being elected or moved (as right after partitions are added), a slow broker. confluent-kafka
# marks none of them retriable on the errors offsets_for_times gives.
_PASSING_CODES = frozenset(
    {
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.OFFSET_NOT_AVAILABLE,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
    }
)


class TopicVanished(KafkaSourceError):
    """The broker does not know a partition its metadata listed a moment before: the topic
    was deleted meanwhile (and may be being created again)."""


def _vanished(partitions: Sequence[PartitionKey]) -> str:
    topics = sorted({topic for topic, _ in partitions})
    return f"listing offsets of {topics} failed: the broker no longer knows them (deleted?)"


def _passing(error: KafkaError) -> bool:
    return error.retriable() or error.code() in _PASSING_CODES


class KafkaLookups:
    """Driver-side Kafka look-ups: partitions of the subscribed topics, offsets by time."""

    def __init__(self, options: SourceOptions) -> None:
        self._options = options
        self._missing: list[str] = []  # subscribed topics found missing at the last look
        self._consumer = make_consumer(
            options.bootstrap_servers,
            options.client_options,
            secret_options=options.secret_options,
        )
        self._tail_reader: Consumer | None = None

    def partitions(self) -> list[PartitionKey]:
        """Every partition of the subscribed topics, and of the topics matching
        `subscribePattern` now, from fresh metadata.

        Raises `TopicError` naming the subscribed topics that do not exist, unless
        `failOnDataLoss` is false: then they are left out, with a warning each time the set
        of missing topics changes (a topic created again is read from its earliest offset).
        """
        topics = self._options.topics
        found = topic_partitions(
            self._consumer, topics, METADATA_TIMEOUT_S, self._options.topic_pattern
        )
        missing = [topic for topic in topics if topic not in found]
        if missing and self._options.fail_on_data_loss:
            raise TopicError(
                f"subscribed topic(s) {missing} do not exist (deleted?); create them, or set "
                "kafka.fail_on_data_loss = false to read the other topics without them"
            )
        if missing != self._missing:
            self._missing = missing
            if missing:
                log.warning(
                    "subscribed topic(s) %s do not exist (deleted?): reading the others "
                    "(failOnDataLoss is false); records they held and were not read are lost",
                    missing,
                )
        return [(topic, p) for topic, partitions in found.items() for p in partitions]

    def list_offsets(self, partitions: Sequence[PartitionKey], timestamp: int) -> Offsets:
        """`offsets_for_times` for `partitions`: `EARLIEST`, `LATEST` or epoch ms.

        For a time, the answer is the first offset at or after it, or -1 when there is none.
        A retriable error, for one partition or the whole request (a partition whose leader
        is still being elected, as right after partitions are added), is asked again until
        `METADATA_TIMEOUT_S` has passed. Raises `TopicVanished` when the broker does not know
        a partition (its topic was deleted since the metadata listed it), `KafkaSourceError`
        naming the partition the broker answered with another error, or with a retriable one
        for that long, and `KafkaException` when the request itself fails so.
        """
        offsets: Offsets = {}
        pending = list(partitions)
        deadline = time.monotonic() + METADATA_TIMEOUT_S
        while pending:
            try:
                answers = self._consumer.offsets_for_times(
                    [TopicPartition(topic, p, timestamp) for topic, p in pending],
                    timeout=METADATA_TIMEOUT_S,
                )
            except KafkaException as e:
                if e.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                    raise TopicVanished(_vanished(pending)) from e
                if not (_passing(e.args[0]) and time.monotonic() < deadline):
                    raise
                time.sleep(_RETRY_PAUSE_S)
                continue
            pending = []
            for answer in answers:
                key = (answer.topic, answer.partition)
                if answer.error is None:
                    offsets[key] = answer.offset
                elif answer.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                    raise TopicVanished(_vanished([key]))
                elif _passing(answer.error) and time.monotonic() < deadline:
                    pending.append(key)
                else:
                    raise KafkaSourceError(
                        redact(f"listing offsets of {key[0]}[{key[1]}] failed: {answer.error}")
                    )
            if pending:
                time.sleep(_RETRY_PAUSE_S)
        return offsets

    def holding_records(self, tails: Mapping[PartitionKey, tuple[int, int]]) -> set[PartitionKey]:
        """The partitions of `tails` ((start, end) offsets of each) that hold a committed
        record in that range, or may: not read to its end within `_TAIL_READ_S`, ended before
        it (an open transaction, or a topic deleted and created again since its end was
        listed: the next look at it tells), or not read at all because Kafka answered with an
        error (logged)."""
        read = ReadToEnd(
            self._tail_consumer(),
            {key: start for key, (start, _) in tails.items()},
            {key: end for key, (_, end) in tails.items()},
        )
        try:
            holding = {(m.topic(), m.partition()) for m in read.messages(_TAIL_READ_S)}
        except KafkaException as error:
            log.info("reading the tails of %s failed, read as holding records: %s", tails, error)
            return set(tails)
        return holding | set(read.unfinished) | read.ended_short

    def scan_timestamps(
        self,
        begin: Mapping[PartitionKey, int],
        latest: Mapping[PartitionKey, int],
        scan: FrontierScan,
    ) -> dict[PartitionKey, int] | None:
        """Show `scan` the committed records of each partition from `begin` until its frontier
        is found or `latest` is reached, for at most `_SCAN_RECORDS` records and
        `_TAIL_READ_S`; returns the next offset of each partition it did not read to its end,
        or None when Kafka answered with an error (logged)."""
        read = ReadToEnd(self._tail_consumer(), dict(begin), {key: latest[key] for key in begin})
        try:
            for message in read.messages(_TAIL_READ_S, limit=_SCAN_RECORDS):
                key = (message.topic(), message.partition())
                scan.see(key, message.offset(), message.timestamp()[1])
                if begin.keys() <= scan.not_due.keys():
                    break
        except KafkaException as error:
            log.info("reading the timestamps of %s failed, read later: %s", begin, error)
            return None
        return read.unfinished

    def _tail_consumer(self) -> Consumer:
        """The read_committed consumer of the tails and scans, made on first use."""
        if self._tail_reader is None:
            self._tail_reader = make_consumer(
                self._options.bootstrap_servers,
                reading_options(self._options.client_options, Reading.TO_END),
                secret_options=self._options.secret_options,
            )
        return self._tail_reader

    def close(self) -> None:
        self._consumer.close()
        if self._tail_reader is not None:
            self._tail_reader.close()
