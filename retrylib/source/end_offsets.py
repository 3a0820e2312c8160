"""What a batch of the `retrylib_kafka` source may read up to, planned on the driver.

Every partition's end is its latest offset; a delay tier's is its delay frontier, the first
record not due yet (`offsets.delay_frontier`), moved past a not-yet-due tail that holds only
transaction markers (`offsets.marker_tails`) and past what the time index hides behind a
record stamped ahead of the clock (`offsets.FrontierScan`). Topics deleted and created
again, or deleted, are noticed here and the records they took counted for the next batch
(`records_lost`). While the job's breaker is open or paused (`retrylib.retry.breaker`),
the main topics, or every partition, are held where the batch starts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from retrylib.config.durations import format_duration
from retrylib.errors import TopicError
from retrylib.kafka.offsets import (
    EARLIEST,
    LATEST,
    FrontierScan,
    Offsets,
    PartitionKey,
    delay_frontier,
    floor_at,
    hidden_frontiers,
    limit_offsets,
    marker_tails,
    not_read,
    past_markers,
    recreated_topics,
    with_new_partitions,
)
from retrylib.logs import OnceAMinute
from retrylib.retry.breaker import main_topic_allowance, read_state
from retrylib.retry.policy import due_timestamp_ms, latest_fair_timestamp_ms
from retrylib.source.lookups import KafkaLookups, TopicVanished
from retrylib.source.options import SourceOptions
from retrylib.source.range_reader import METADATA_TIMEOUT_S

log = logging.getLogger(__name__)

_LOOK_AGAIN_S = 0.2  # between looks when a topic vanished under one
_STAMPED_AHEAD_LOG = logging.getLogger(__name__ + ".stamped_ahead")
_STAMPED_AHEAD_LOG.addFilter(OnceAMinute())


class EndOffsets:
    """The end offsets a `KafkaStreamReader` may plan its batches to, and what it remembers
    between looks (see the module docstring). The reader hands each look its `KafkaLookups`.
    """

    def __init__(self, options: SourceOptions) -> None:
        self._options = options
        self._tails_with_records: dict[PartitionKey, tuple[int, int]] = {}
        # Every partition's latest offset at the last look, to count what a deleted topic took.
        self._latest_seen: Offsets = {}
        # Records deleted topics took unread since the last batch planned, for the next one.
        self._records_lost = 0
        # The first not-due record (offset, timestamp) each scan found (`FrontierScan`).
        self._not_due: dict[PartitionKey, tuple[int, int]] = {}

    def take_lost(self) -> int:
        """The records deleted topics took unread since the last call (for a batch's
        `records_lost`), counted from now on anew."""
        lost, self._records_lost = self._records_lost, 0
        return lost

    def held_by_breaker(self, begin: Offsets, end: Offsets) -> Offsets:
        """`end` with the main topics held at `begin` while the breaker is open, or cut to
        its probe's records when one is due, and every partition held at `begin` while the
        job is paused (`retrylib.retry.breaker`)."""
        assert self._options.breaker_file is not None
        state = read_state(self._options.breaker_file)
        if state.paused:  # everything waits where it is: the downstream is down
            return {key: begin.get(key, offset) for key, offset in end.items()}
        allowance = main_topic_allowance(state, int(time.time() * 1000))
        if allowance is None:
            return end
        main = {key: offset for key, offset in end.items() if key[0] not in self._options.delays_ms}
        held = {key: begin[key] for key in main}
        if allowance > 0:
            held = limit_offsets(held, main, allowance)
        return {**end, **held}

    def available(self, kafka: KafkaLookups, start: Offsets) -> tuple[Offsets, Offsets]:
        """`start` completed with new partitions at earliest, and the available end offsets.

        The end keeps the start of every topic the source no longer subscribes to (a retry
        tier or a main topic taken out of the config): subscribed again, the topic is read on
        from there, not from its earliest record again.

        A look that finds a listed topic unknown to the broker (deleted meanwhile, and maybe
        being created again) is started over from fresh metadata until `METADATA_TIMEOUT_S`
        has passed. What it counted lost is counted once: the next try compares with the
        offsets this one saw.
        """
        deadline = time.monotonic() + METADATA_TIMEOUT_S
        while True:
            try:
                return self._look(kafka, start)
            except TopicVanished:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(_LOOK_AGAIN_S)

    def _look(self, kafka: KafkaLookups, start: Offsets) -> tuple[Offsets, Offsets]:
        """One try of `available`."""
        partitions = kafka.partitions()
        end = kafka.list_offsets(partitions, LATEST)
        start = self._without_recreated(start, end)
        self._count_gone(start, end)
        self._latest_seen = dict(end)
        new = [key for key in partitions if key not in start]
        if new:
            start = with_new_partitions(start, new, kafka.list_offsets(new, EARLIEST))
        now_ms = int(time.time() * 1000)
        due_by_ms = now_ms + self._options.read_ahead_ms
        for delay_ms in set(self._options.delays_ms.values()):
            tier = [key for key in partitions if self._options.delays_ms.get(key[0]) == delay_ms]
            due_before_ms = due_timestamp_ms(due_by_ms, delay_ms)
            latest = {key: end[key] for key in tier}
            frontier = delay_frontier(kafka.list_offsets(tier, due_before_ms), latest)
            fair_until_ms = latest_fair_timestamp_ms(
                now_ms, delay_ms, self._options.tier_stamps_ahead
            )
            scan = FrontierScan(due_before_ms, fair_until_ms)
            frontier = self._past_stamped_ahead(kafka, frontier, start, latest, scan, now_ms)
            end.update(self._past_markers(kafka, frontier, latest))
        return start, {**self.not_read(start), **floor_at(end, start)}

    def _without_recreated(self, start: Offsets, latest: Offsets) -> Offsets:
        """`start` without the topics that were deleted and created again since
        (`recreated_topics`: `latest` is behind it, or behind what this reader saw), which are
        then read from their earliest offsets.

        Raises `TopicError` naming them and what changed, unless `failOnDataLoss` is false:
        then a warning says so, and the next batch counts them in `records_lost`. Both count
        the records this reader last saw waiting there (they went with the old topic), when
        it saw the topic before.
        """
        recreated = recreated_topics(start, latest, self._latest_seen)
        if not recreated:
            return start
        changes = "; ".join(f"{topic!r}: {', '.join(what)}" for topic, what in recreated.items())
        waited = self._waited([key for key in start if key[0] in recreated], start)
        if waited is not None:
            lost = f"the {waited} record(s) that waited there unread are lost"
        else:
            lost = "the records that waited there unread are lost"
        if self._options.fail_on_data_loss:
            raise TopicError(
                f"topic(s) deleted and created again since the job read them ({changes}): "
                f"{lost}. To read them on from their start, set kafka.fail_on_data_loss = "
                "false for one run"
            )
        log.warning(
            "topic(s) deleted and created again since the job read them (%s): %s; reading "
            "them from their start (failOnDataLoss is false)",
            changes,
            lost,
        )
        self._records_lost += waited or 0
        return {key: offset for key, offset in start.items() if key[0] not in recreated}

    def _count_gone(self, start: Offsets, latest: Offsets) -> None:
        """Count, for the next batch's `records_lost`, the records this reader last saw
        waiting unread in subscribed topics that are gone now (deleted; with `failOnDataLoss`
        false, `KafkaLookups.partitions` leaves them out), with a warning naming them."""
        present = {topic for topic, _ in latest}
        unsubscribed = self.not_read(start)
        gone = [key for key in start if key[0] not in present and key not in unsubscribed]
        waited = self._waited(gone, start)
        if waited:
            topics = sorted({topic for topic, _ in gone})
            log.warning(
                "topic(s) %s deleted: the %d record(s) that waited there unread are lost",
                topics,
                waited,
            )
            self._records_lost += waited

    def _waited(self, keys: Sequence[PartitionKey], start: Offsets) -> int | None:
        """The records between `start` and the latest offset this reader last saw, over those
        of `keys` it saw (None: it saw none of them)."""
        seen = [key for key in keys if key in self._latest_seen]
        if not seen:
            return None
        return sum(max(self._latest_seen[key] - start[key], 0) for key in seen)

    def not_read(self, offsets: Offsets) -> Offsets:
        """The entries of `offsets` of topics this source no longer subscribes to."""
        return not_read(offsets, self._options.topics, self._options.topic_pattern)

    def _past_stamped_ahead(
        self,
        kafka: KafkaLookups,
        frontier: Offsets,
        start: Offsets,
        latest: Offsets,
        scan: FrontierScan,
        now_ms: int,
    ) -> Offsets:
        """`frontier` of a delay tier with the frontiers the time index hides behind a record
        stamped ahead of the clock found by reading timestamps (`hidden_frontiers`); each such
        record is named in a WARN (one a minute per partition) and read now.

        Asks the index once more (for the latest fair timestamp) about the partitions with
        a not-yet-due tail; reads only the hidden ones, from their frontier, for a bounded
        number of records and time (`KafkaLookups.scan_timestamps`), and none whose frontier
        an earlier read found and is not due yet. (A transaction's commit marker that
        `_past_markers` passed is such a hidden frontier too, until its time: one fetch finds
        the record after it not due, and that is kept.)
        """
        waiting = [key for key, offset in frontier.items() if start[key] <= offset < latest[key]]
        first_ahead = kafka.list_offsets(waiting, scan.fair_until_ms + 1) if waiting else {}
        hidden = hidden_frontiers(frontier, start, latest, first_ahead)
        if not hidden:
            return frontier
        known = scan.known(hidden, self._not_due)
        unread: dict[PartitionKey, int] | None = {}
        if len(known) < len(hidden):
            to_read = {key: begin for key, begin in hidden.items() if key not in known}
            unread = kafka.scan_timestamps(to_read, latest, scan)
        if unread is None:
            return frontier
        self._not_due.update(scan.not_due)
        for (topic, partition), offset, timestamp_ms in scan.stamped_ahead:
            _STAMPED_AHEAD_LOG.warning(
                "%s: the record at offset %d has a Kafka timestamp %s ahead of this clock: "
                "its producer's clock is off. It is read now and judged by its headers, and "
                "the records behind it are read as they fall due",
                f"{topic}[{partition}]",
                offset,
                format_duration((timestamp_ms - now_ms) // 1000 * 1000),
            )
        return {**frontier, **scan.moved(hidden, latest, unread)}

    def _past_markers(self, kafka: KafkaLookups, frontier: Offsets, latest: Offsets) -> Offsets:
        """`frontier` of a delay tier moved past its not-yet-due tails that hold only
        transaction markers (`marker_tails`), so that no batch runs for the markers alone;
        a tail found to hold records is remembered and not looked at again."""
        tails = marker_tails(frontier, latest, self._tails_with_records)
        if not tails:
            return frontier
        holding = kafka.holding_records(tails)
        self._tails_with_records.update({key: tails[key] for key in holding})
        return past_markers(frontier, latest, (key for key in tails if key not in holding))
