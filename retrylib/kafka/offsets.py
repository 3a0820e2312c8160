"""Offset arithmetic for the Kafka stream source: pure functions, no Spark and no Kafka I/O.

Offsets are held as `{(topic, partition): next_offset}`. Spark checkpoints them as JSON in
the layout of Spark's own Kafka source, `{"topic": {"0": 123, "1": 45}}`, produced in a
stable order (topics sorted, partitions numerically) because the engine compares offsets
as JSON text: the same offsets must always serialise to the same string.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from retrylib.config.topic_names import subscribed

PartitionKey = tuple[str, int]
Offsets = dict[PartitionKey, int]
T = TypeVar("T")

EARLIEST = -2
"""In `startingOffsets` JSON (Kafka's convention): start at the partition's first offset."""
LATEST = -1
"""In `startingOffsets` JSON (Kafka's convention): start at the partition's end."""
AT_TIMESTAMP = -3
"""Start at the partition's first record at or after `StartingOffsets.timestamp_ms`, or at
its end when there is none."""


@dataclass(frozen=True)
class StartingOffsets:
    """Where a new query starts: `explicit` offsets per partition, `default` for the rest.

    Offsets are concrete offsets or `EARLIEST` / `LATEST` / `AT_TIMESTAMP`.
    """

    default: int
    explicit: Mapping[PartitionKey, int] = field(default_factory=dict)
    timestamp_ms: int | None = None  # for AT_TIMESTAMP


@dataclass(frozen=True)
class OffsetRange:
    """Offsets `start` (inclusive) to `end` (exclusive) of one topic-partition."""

    topic: str
    partition: int
    start: int
    end: int


def parse_topics(value: str | None) -> list[str]:
    """The topics of a comma-separated `subscribe` option, in order, without duplicates.

    Raises `ValueError` when the option is missing or names no topic.
    """
    topics = list(dict.fromkeys(t.strip() for t in (value or "").split(",") if t.strip()))
    if not topics:
        raise ValueError(f"option subscribe={value!r} must name at least one topic")
    return topics


def parse_starting_offsets(
    value: str | None, topics: Collection[str], *, any_topic: bool = False
) -> StartingOffsets:
    """Parse `startingOffsets`: "earliest" (the default), "latest", or JSON per partition.

    The JSON form is `{"topic": {"0": 23, "1": -2}}` with -2 for earliest and -1 for latest;
    partitions it does not name start at earliest. Raises `ValueError` naming the option and
    the bad part: malformed JSON, a topic outside `topics` (unless `any_topic`: a pattern
    subscription), a bad partition or offset.
    """
    text = (value or "earliest").strip()
    if text.lower() == "earliest":
        return StartingOffsets(EARLIEST)
    if text.lower() == "latest":
        return StartingOffsets(LATEST)
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(
            f"option startingOffsets={value!r} is not 'earliest', 'latest' or JSON: {e}"
        ) from e
    explicit = offsets_from_json(parsed, what=f"option startingOffsets={value!r}", minimum=-2)
    unknown = sorted({topic for topic, _ in explicit} - set(topics))
    if unknown and not any_topic:
        raise ValueError(
            f"option startingOffsets={value!r} names topic(s) {unknown} "
            f"that are not in subscribe {sorted(topics)}"
        )
    return StartingOffsets(EARLIEST, explicit)


def resolve_starting_offsets(
    spec: StartingOffsets,
    partitions: Iterable[PartitionKey],
    earliest: Mapping[PartitionKey, int],
    latest: Mapping[PartitionKey, int],
    at_timestamp: Mapping[PartitionKey, int] | None = None,
) -> Offsets:
    """Concrete start offsets of `partitions`, given each one's earliest and latest offset
    and, for `AT_TIMESTAMP`, its first offset at or after the spec's time (negative: none).

    Raises `ValueError` when `spec` names a partition that is not among `partitions`.
    """
    keys = sorted(partitions)
    missing = sorted(set(spec.explicit) - set(keys))
    if missing:
        names = ", ".join(f"{t}[{p}]" for t, p in missing)
        raise ValueError(f"option startingOffsets names partition(s) that do not exist: {names}")
    resolved = {}
    for key in keys:
        offset = spec.explicit.get(key, spec.default)
        if offset == EARLIEST:
            offset = earliest[key]
        elif offset == AT_TIMESTAMP:
            offset = (at_timestamp or {}).get(key, -1)
            if offset < 0:
                offset = latest[key]
        elif offset == LATEST:
            offset = latest[key]
        resolved[key] = offset
    return resolved


def offsets_to_json(offsets: Mapping[PartitionKey, int]) -> dict[str, dict[str, int]]:
    """`{(topic, partition): offset}` as `{"topic": {"partition": offset}}`, in stable order."""
    nested: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        nested.setdefault(topic, {})[str(partition)] = int(offset)
    return nested


def offsets_from_json(
    value: object, what: str = "offsets", minimum: int = 0
) -> dict[PartitionKey, int]:
    """Parse `{"topic": {"partition": offset}}` into `{(topic, partition): offset}`.

    Raises `ValueError` naming `what` and the bad entry when the layout is wrong, a partition
    is not a non-negative integer, or an offset is not an integer >= `minimum`.
    """
    if not isinstance(value, Mapping):
        raise ValueError(f"{what}: expected {{topic: {{partition: offset}}}}, got {value!r}")
    offsets = {}
    for topic, partitions in value.items():
        if not isinstance(partitions, Mapping):
            raise ValueError(f"{what}: topic {topic!r} must map to {{partition: offset}}")
        for partition, offset in partitions.items():
            key = (topic, _partition_number(partition, topic, what))
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < minimum:
                raise ValueError(
                    f"{what}: offset {offset!r} of {topic}[{partition}] "
                    f"must be an integer >= {minimum}"
                )
            offsets[key] = offset
    return offsets


def _partition_number(partition: object, topic: str, what: str) -> int:
    text = str(partition)
    if not text.isdigit():
        raise ValueError(f"{what}: partition {partition!r} of topic {topic!r} is not a number")
    return int(text)


def with_new_partitions(
    start: Mapping[PartitionKey, int],
    partitions: Iterable[PartitionKey],
    earliest: Mapping[PartitionKey, int],
) -> Offsets:
    """`start` plus every partition of `partitions` it lacks, at that partition's earliest offset.

    Raises `KeyError` when a partition missing from `start` has no entry in `earliest`.
    """
    merged = dict(start)
    for key in partitions:
        if key not in merged:
            merged[key] = earliest[key]
    return merged


def delay_frontier(due: Mapping[PartitionKey, int], latest: Mapping[PartitionKey, int]) -> Offsets:
    """End offsets of a delay tier: the first not-yet-due offset of each partition of `latest`.

    `due` holds the answers of `offsets_for_times(now - delay)`: the first offset whose
    timestamp is at or after that time, or a negative value when there is none (every record
    is due). The result never passes the partition's `latest` offset.
    """
    frontier = {}
    for key, end in latest.items():
        first_not_due = due.get(key, -1)
        frontier[key] = end if first_not_due < 0 else min(first_not_due, end)
    return frontier


def hidden_frontiers(
    frontier: Mapping[PartitionKey, int],
    start: Mapping[PartitionKey, int],
    latest: Mapping[PartitionKey, int],
    first_stamped_ahead: Mapping[PartitionKey, int],
) -> dict[PartitionKey, int]:
    """The partitions of a delay tier whose true frontier Kafka's time index hides, each with
    the offset to read timestamps from (`FrontierScan`).

    The index answers with the first offset stamped at or after a time, so one record
    stamped ahead of the clock hides every record behind it until its time comes: a frontier
    that is such a record (it is also `first_stamped_ahead`, the index's answer for the
    latest fair timestamp), or one this reader has already passed (below `start`).
    """
    hidden = {}
    for key, offset in frontier.items():
        begin = max(offset, start[key])
        if begin >= latest[key]:
            continue
        if offset < start[key] or first_stamped_ahead.get(key) == offset:
            hidden[key] = begin
    return hidden


@dataclass
class FrontierScan:
    """The frontiers of delay tier partitions found by reading their records' timestamps in
    offset order, where the time index cannot say (`hidden_frontiers`).

    A record stamped before `due_before_ms` is due; one stamped after `fair_until_ms` is
    stamped ahead, passed over and kept in `stamped_ahead` (it is read now, and judged by its
    headers); any other is not due, and is its partition's frontier, kept in `not_due` with
    its timestamp. A frontier found earlier stays one while it is not due (`known`): the
    records before it do not change.
    """

    due_before_ms: int
    fair_until_ms: int
    not_due: dict[PartitionKey, tuple[int, int]] = field(default_factory=dict)
    stamped_ahead: list[tuple[PartitionKey, int, int]] = field(default_factory=list)

    def see(self, key: PartitionKey, offset: int, timestamp_ms: int) -> None:
        """Take the next record of partition `key` (records before its frontier only)."""
        if key in self.not_due:
            return
        if timestamp_ms > self.fair_until_ms:
            self.stamped_ahead.append((key, offset, timestamp_ms))
        elif timestamp_ms >= self.due_before_ms:
            self.not_due[key] = (offset, timestamp_ms)

    def known(
        self, hidden: Mapping[PartitionKey, int], found: Mapping[PartitionKey, tuple[int, int]]
    ) -> dict[PartitionKey, int]:
        """The partitions of `hidden` whose frontier an earlier scan `found`, still ahead of
        where this one would begin and still not due; each is taken as this scan's."""
        known = {}
        for key, begin in hidden.items():
            offset, timestamp_ms = found.get(key, (-1, 0))
            if offset >= begin and timestamp_ms >= self.due_before_ms:
                self.not_due[key] = (offset, timestamp_ms)
                known[key] = offset
        return known

    def moved(
        self,
        hidden: Mapping[PartitionKey, int],
        latest: Mapping[PartitionKey, int],
        unread: Mapping[PartitionKey, int],
    ) -> Offsets:
        """The frontier of each `hidden` partition: where its first not-due record is, else
        the next offset the read did not reach (`unread`: out of time or records), else
        `latest`."""
        return {
            key: self.not_due[key][0] if key in self.not_due else unread.get(key, latest[key])
            for key in hidden
        }


MARKER_TAIL = 64
"""The most offsets a delay tier partition's not-yet-due tail may span for the source to look
whether it holds records at all (`marker_tails`)."""


def marker_tails(
    frontier: Mapping[PartitionKey, int],
    latest: Mapping[PartitionKey, int],
    known_to_hold_records: Mapping[PartitionKey, tuple[int, int]],
) -> dict[PartitionKey, tuple[int, int]]:
    """The not-yet-due tails (frontier, latest) of a delay tier worth a look: short ones
    (`MARKER_TAIL` offsets at most) not already known to hold records.

    A transaction's commit marker takes an offset after its records, with the time of the
    commit, later than theirs: once the records are due, the marker alone may still be "not
    due", and would make a batch of its own a moment later. A tail that holds no committed
    record is read at once instead (`past_markers`).
    """
    tails = {}
    for key, offset in frontier.items():
        tail = (offset, latest[key])
        if 0 < tail[1] - tail[0] <= MARKER_TAIL and known_to_hold_records.get(key) != tail:
            tails[key] = tail
    return tails


def past_markers(
    frontier: Mapping[PartitionKey, int],
    latest: Mapping[PartitionKey, int],
    without_records: Iterable[PartitionKey],
) -> Offsets:
    """`frontier` moved to `latest` for the partitions whose tail holds no committed record."""
    moved = dict(frontier)
    for key in without_records:
        moved[key] = latest[key]
    return moved


def not_read(
    offsets: Mapping[PartitionKey, int], topics: Collection[str], pattern: str | None
) -> Offsets:
    """The entries of `offsets` whose topic a reader of `topics` and of the topics matching
    `pattern` does not read (`subscribed`)."""
    return {
        key: offset for key, offset in offsets.items() if not subscribed(key[0], topics, pattern)
    }


def recreated_topics(
    start: Mapping[PartitionKey, int],
    latest: Mapping[PartitionKey, int],
    seen: Mapping[PartitionKey, int],
) -> dict[str, list[str]]:
    """The topics of `latest` that went back, with what went back: a partition of `start`
    that is gone, or whose latest offset is below its position in `start`, or below the
    latest offset `seen` at an earlier look.

    Kafka's offsets never go back, so each means the topic was deleted and created again
    (or lost its log). Topics of `start` absent from `latest` are not judged.
    """
    read = {topic for topic, _ in latest}
    changed: dict[str, list[str]] = {}
    for (topic, partition), position in sorted(start.items()):
        if topic not in read:
            continue
        now = latest.get((topic, partition))
        earlier = seen.get((topic, partition), -1)
        if now is None:
            changed.setdefault(topic, []).append(f"partition {partition} is gone")
        elif now < position:
            changed.setdefault(topic, []).append(
                f"partition {partition} ends at offset {now}, before the job's position {position}"
            )
        elif now < earlier:
            changed.setdefault(topic, []).append(
                f"partition {partition} ends at offset {now}, before offset {earlier} it had"
            )
    return changed


def floor_at(end: Mapping[PartitionKey, int], start: Mapping[PartitionKey, int]) -> Offsets:
    """`end` raised to `start` wherever it would be below it (offsets never go back)."""
    return {key: max(offset, start.get(key, offset)) for key, offset in end.items()}


def cap_at_target(
    start: Mapping[PartitionKey, int],
    end: Mapping[PartitionKey, int],
    target: Mapping[PartitionKey, int],
) -> Offsets:
    """`end` held to the Trigger.AvailableNow `target`, never below `start`.

    Partitions that appeared after the target was taken are held at their start: an
    availableNow run reads nothing that arrived after it began. `start` must hold every key
    of `end`.
    """
    return {
        key: max(min(offset, target.get(key, start[key])), start[key])
        for key, offset in end.items()
    }


def limit_offsets(
    start: Mapping[PartitionKey, int], end: Mapping[PartitionKey, int], max_records: int
) -> Offsets:
    """`end` cut down so that at most `max_records` records lie between `start` and it.

    The budget is split across partitions in proportion to their backlog (largest remainder,
    ties by topic and partition), and every partition with a backlog gets at least one record
    so none starves; when `max_records` is below the number of such partitions, that floor
    wins and the batch holds one record per partition. `start` must hold every key of `end`.
    Raises `ValueError` when `max_records` < 1.
    """
    if max_records < 1:
        raise ValueError(f"max_records must be >= 1, got {max_records!r}")
    backlog = {key: end[key] - start[key] for key in sorted(end) if end[key] > start[key]}
    if sum(backlog.values()) <= max_records:
        return dict(end)
    shares = _apportion(backlog, max_records)
    return {key: start[key] + shares[key] if key in shares else end[key] for key in end}


def _apportion(backlog: Mapping[PartitionKey, int], budget: int) -> dict[PartitionKey, int]:
    """One record each, then what is left of `budget` split by remaining backlog.

    Expects `budget` < the total backlog; the split uses largest remainders, so the shares
    add up to `budget` exactly (when it covers the one-each floor) and none exceeds its backlog.
    """
    shares = dict.fromkeys(backlog, 1)
    spare = budget - len(backlog)
    if spare <= 0:
        return shares
    rest = {key: size - 1 for key, size in backlog.items()}
    rest_total = sum(rest.values())
    remainders = {}
    for key, size in rest.items():
        whole, remainders[key] = divmod(spare * size, rest_total)
        shares[key] += whole
    leftover = budget - sum(shares.values())
    for key in sorted(remainders, key=lambda key: (-remainders[key], key))[:leftover]:
        shares[key] += 1
    return shares


def split_ranges(
    start: Mapping[PartitionKey, int], end: Mapping[PartitionKey, int], max_records: int
) -> list[OffsetRange]:
    """The ranges to read between `start` and `end`, each at most `max_records` offsets long.

    Partitions with nothing to read are left out; `start` must hold every key of `end`.
    Raises `ValueError` when `max_records` < 1.
    """
    if max_records < 1:
        raise ValueError(f"max_records must be >= 1, got {max_records!r}")
    ranges = []
    for topic, partition in sorted(end):
        first, stop = start[(topic, partition)], end[(topic, partition)]
        for chunk_start in range(first, stop, max_records):
            ranges.append(
                OffsetRange(topic, partition, chunk_start, min(chunk_start + max_records, stop))
            )
    return ranges


def group_ranges(ranges: Sequence[OffsetRange], groups: int) -> list[list[OffsetRange]]:
    """`ranges` dealt into at most `groups` groups of about equal record counts (`deal`).

    The groups differ by at most one range's length. Raises `ValueError` when `groups` < 1.
    """
    return deal(ranges, groups, range_length)


def range_length(offset_range: OffsetRange) -> int:
    return offset_range.end - offset_range.start


def deal(items: Sequence[T], bins: int, size: Callable[[T], int]) -> list[list[T]]:
    """`items` dealt into at most `bins` lists of about equal total `size`: largest first,
    each to the list with the least so far. Empty lists are left out. Raises `ValueError`
    when `bins` < 1.
    """
    if bins < 1:
        raise ValueError(f"groups must be >= 1, got {bins!r}")
    dealt: list[list[T]] = [[] for _ in range(min(bins, len(items)))]
    sizes = [0] * len(dealt)
    for item in sorted(items, key=size, reverse=True):
        smallest = sizes.index(min(sizes))
        dealt[smallest].append(item)
        sizes[smallest] += size(item)
    return dealt


def reached(position: Mapping[PartitionKey, int], target: Mapping[PartitionKey, int]) -> bool:
    """True when `position` is at or past `target` in every partition `target` names."""
    return all(position.get(key, -1) >= offset for key, offset in target.items())


def progress_end_offsets(progress_json: str) -> Offsets:
    """End offsets of the batch a streaming query progress (its JSON) reports, every source
    merged (the sources of one query read distinct topics).

    A source's `endOffset` is its offsets object, or that object as JSON text; a source
    without offsets (null) or with offsets of another shape adds nothing.
    """
    offsets: Offsets = {}
    for source in json.loads(progress_json).get("sources") or []:
        end = source.get("endOffset")
        if isinstance(end, str):
            try:
                end = json.loads(end)
            except ValueError:
                continue
        try:
            offsets.update(offsets_from_json(end, what="progress end offsets"))
        except ValueError:
            continue
    return offsets
