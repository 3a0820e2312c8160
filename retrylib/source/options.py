"""The options of the `retrylib_kafka` source, parsed and checked (`parse_source_options`).

The names are those of Spark's built-in `kafka` source (`kafka.bootstrap.servers`,
`subscribe`, `startingOffsets`, `startingTimestamp`, `maxOffsetsPerTrigger`,
`failOnDataLoss`, `kafka.*` pass-through) and the
source's own `retrylib.*` ones, described in `retrylib.source.kafka_source`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from pyspark.sql.types import StructType

from retrylib.config.topic_names import subscribed
from retrylib.kafka.arrow_records import KAFKA_SCHEMA, KEY_RANGE_SCHEMA, RANGE_SCHEMA
from retrylib.kafka.offsets import (
    AT_TIMESTAMP,
    Offsets,
    StartingOffsets,
    offsets_from_json,
    parse_starting_offsets,
    parse_topics,
)

OPTION_BOOTSTRAP = "kafka.bootstrap.servers"
OPTION_SUBSCRIBE = "subscribe"
OPTION_SUBSCRIBE_PATTERN = "subscribePattern"
"""A regular expression: every topic whose whole name matches it is read too, as it comes
and goes (Kafka's internal "__" topics excepted)."""
OPTION_STARTING_OFFSETS = "startingOffsets"
OPTION_STARTING_TIMESTAMP = "startingTimestamp"
"""Epoch ms: a new query starts each partition at its first record at or after it, or at
the partition's end when there is none. Wins over `startingOffsets`, as in Spark's source."""
OPTION_FAIL_ON_DATA_LOSS = "failOnDataLoss"
OPTION_MAX_OFFSETS_PER_TRIGGER = "maxOffsetsPerTrigger"
OPTION_TOPIC_DELAYS_MS = "retrylib.topicDelaysMs"
OPTION_READ_AHEAD_MS = "retrylib.readAheadMs"
"""A delay tier's records due up to this many ms after now are read now (default 0): the
task that handles them waits until each is due (`retrylib.task.routing`)."""
OPTION_TIER_STAMPS_AHEAD = "retrylib.tierStampsAhead"
"""`true` (default): the job's producers stamp a delay tier's records up to one delay ahead of
their clock; `false`: no later than now (a delay router's topics)."""
OPTION_MAX_RECORDS_PER_TASK = "retrylib.maxRecordsPerTask"
OPTION_EMIT = "retrylib.emit"
OPTION_RANGE_GROUPS = "retrylib.rangeGroups"
OPTION_SECRET_OPTIONS = "retrylib.secretOptions"
"""JSON list of the `kafka.*` options (names without the prefix) whose values are secret:
masked in this source's log lines and errors, in every process that reads (see
`retrylib.kafka.clients.client_config`)."""

OPTION_AVAILABLE_NOW_OFFSETS = "retrylib.availableNowOffsets"
OPTION_BREAKER_FILE = "retrylib.breakerFile"
"""A local file with the job's breaker state (`retrylib.retry.breaker`): main topics held while
open."""
OPTION_KEY_ORDER = "retrylib.keyOrder"
"""JSON `{"tiers": {main topic: [its tier topics]}, "stateFile": path}`: ranges come in key
groups (`key_groups`), each group's first row carrying its keys' queues from the local
state file (`retrylib.retry.key_order`); needs `retrylib.emit = ranges`."""
_EMIT_VALUES = ("records", "ranges")
_KNOWN_OPTIONS = {
    name.lower(): name
    for name in (
        OPTION_BOOTSTRAP,
        OPTION_SUBSCRIBE,
        OPTION_SUBSCRIBE_PATTERN,
        OPTION_STARTING_OFFSETS,
        OPTION_STARTING_TIMESTAMP,
        OPTION_FAIL_ON_DATA_LOSS,
        OPTION_MAX_OFFSETS_PER_TRIGGER,
        OPTION_TOPIC_DELAYS_MS,
        OPTION_READ_AHEAD_MS,
        OPTION_TIER_STAMPS_AHEAD,
        OPTION_MAX_RECORDS_PER_TASK,
        OPTION_EMIT,
        OPTION_RANGE_GROUPS,
        OPTION_SECRET_OPTIONS,
        OPTION_AVAILABLE_NOW_OFFSETS,
        OPTION_BREAKER_FILE,
        OPTION_KEY_ORDER,
    )
}
# Consumer settings the source relies on; a user value would break offset-exact reads.
_RESERVED_CLIENT_OPTIONS = {"auto.offset.reset", "enable.auto.commit", "enable.partition.eof"}
DEFAULT_MAX_RECORDS_PER_TASK = 250_000


@dataclass(frozen=True)
class SourceOptions:
    """The parsed options of one `retrylib_kafka` stream (see `parse_source_options`)."""

    bootstrap_servers: str
    topics: list[str]  # named ones; with topic_pattern, possibly none
    starting_offsets: StartingOffsets
    max_offsets_per_trigger: int | None = None
    delays_ms: dict[str, int] = field(default_factory=dict)  # retry tier topic -> its delay
    read_ahead_ms: int = 0  # a tier's records due this long from now are read now
    tier_stamps_ahead: bool = True  # the job stamps tier records up to one delay ahead
    max_records_per_task: int = DEFAULT_MAX_RECORDS_PER_TASK
    client_options: dict[str, str] = field(default_factory=dict)
    secret_options: tuple[str, ...] = ()  # names among client_options
    emit_ranges: bool = False
    range_groups: int | None = None  # with emit_ranges: at most this many input partitions
    available_now_offsets: Offsets | None = None  # the end of an availableNow run on 4.0/4.1
    fail_on_data_loss: bool = True  # false: deleted records and topics are skipped, warned of
    topic_pattern: str | None = None  # topics read besides `topics`, by whole-name match
    breaker_file: str | None = None  # the breaker's state (`retrylib.retry.breaker`), if any
    key_order: KeyOrderOption | None = None

    @property
    def schema(self) -> StructType:
        if self.key_order is not None:
            return KEY_RANGE_SCHEMA
        return RANGE_SCHEMA if self.emit_ranges else KAFKA_SCHEMA


@dataclass(frozen=True)
class KeyOrderOption:
    """`retrylib.keyOrder`: each main topic's tier topics, and the local file of the queues."""

    tiers: dict[str, tuple[str, ...]]
    state_file: str


def parse_source_options(options: Mapping[str, str]) -> SourceOptions:
    """Validate and parse the reader options (names are case-insensitive, as in Spark).

    `kafka.*` options other than `kafka.bootstrap.servers` go, prefix stripped, to every
    consumer. Raises `ValueError` naming the option for: a missing required option, an
    unknown option, a reserved consumer setting, or a value that does not parse.
    """
    lowered = {key.lower(): value for key, value in options.items()}
    client_options = {}
    for key, value in lowered.items():
        if key in _KNOWN_OPTIONS:
            continue
        if not key.startswith("kafka."):
            raise ValueError(
                f"unknown option {key!r} for the retrylib_kafka source; known options: "
                f"{sorted(_KNOWN_OPTIONS.values())} and kafka.* consumer settings"
            )
        if key[len("kafka.") :] in _RESERVED_CLIENT_OPTIONS:
            raise ValueError(f"option {key!r} is set by the retrylib_kafka source itself")
        client_options[key[len("kafka.") :]] = value
    bootstrap = lowered.get(OPTION_BOOTSTRAP.lower(), "").strip()
    if not bootstrap:
        raise ValueError(f"option {OPTION_BOOTSTRAP} is required")
    pattern = lowered.get(OPTION_SUBSCRIBE_PATTERN.lower())
    if pattern is not None:
        try:
            re.compile(pattern)
        except re.error as e:
            raise ValueError(f"option {OPTION_SUBSCRIBE_PATTERN}={pattern!r}: {e}") from e
    subscribe = lowered.get(OPTION_SUBSCRIBE.lower())
    topics = [] if pattern is not None and subscribe is None else parse_topics(subscribe)
    emit = lowered.get(OPTION_EMIT.lower(), "records").strip().lower()
    if emit not in _EMIT_VALUES:
        raise ValueError(f"option {OPTION_EMIT}={emit!r} must be one of {list(_EMIT_VALUES)}")
    starting_ms = _int_option(lowered, OPTION_STARTING_TIMESTAMP, 0)
    return SourceOptions(
        bootstrap_servers=bootstrap,
        topics=topics,
        starting_offsets=(
            parse_starting_offsets(
                lowered.get(OPTION_STARTING_OFFSETS.lower()), topics, any_topic=pattern is not None
            )
            if starting_ms is None
            else StartingOffsets(AT_TIMESTAMP, timestamp_ms=starting_ms)
        ),
        max_offsets_per_trigger=_int_option(lowered, OPTION_MAX_OFFSETS_PER_TRIGGER, 1),
        delays_ms=_topic_delays(lowered.get(OPTION_TOPIC_DELAYS_MS.lower()), topics),
        read_ahead_ms=_int_option(lowered, OPTION_READ_AHEAD_MS, 0) or 0,
        tier_stamps_ahead=_bool_option(lowered, OPTION_TIER_STAMPS_AHEAD),
        max_records_per_task=_int_option(lowered, OPTION_MAX_RECORDS_PER_TASK, 1)
        or DEFAULT_MAX_RECORDS_PER_TASK,
        client_options=client_options,
        secret_options=_secret_options(lowered.get(OPTION_SECRET_OPTIONS.lower())),
        emit_ranges=emit == "ranges",
        range_groups=_int_option(lowered, OPTION_RANGE_GROUPS, 1),
        available_now_offsets=_offsets_option(
            lowered, OPTION_AVAILABLE_NOW_OFFSETS, topics, pattern
        ),
        fail_on_data_loss=_bool_option(lowered, OPTION_FAIL_ON_DATA_LOSS),
        topic_pattern=pattern,
        breaker_file=lowered.get(OPTION_BREAKER_FILE.lower()),
        key_order=_key_order(lowered.get(OPTION_KEY_ORDER.lower()), emit),
    )


def _bool_option(lowered: Mapping[str, str], name: str) -> bool:
    """Option `name`, `true` (the default) or `false`; raises `ValueError` for another value."""
    value = lowered.get(name.lower(), "true").strip().lower()
    if value not in ("true", "false"):
        raise ValueError(f"option {name}={value!r} must be true or false")
    return value == "true"


def _key_order(raw: str | None, emit: str) -> KeyOrderOption | None:
    """`retrylib.keyOrder` parsed; raises `ValueError` saying what is wrong with it."""
    if raw is None:
        return None
    if emit != "ranges":
        raise ValueError(f"option {OPTION_KEY_ORDER} needs {OPTION_EMIT} = ranges")
    try:
        parsed = json.loads(raw)
        tiers = {main: tuple(topics) for main, topics in parsed["tiers"].items()}
        state_file = parsed["stateFile"]
    except (ValueError, KeyError, TypeError, AttributeError):
        parsed = None
    if parsed is None or not isinstance(state_file, str):
        raise ValueError(
            f"option {OPTION_KEY_ORDER}={raw!r} must be a JSON object "
            '{"tiers": {"<main topic>": ["<tier topic>", ...]}, "stateFile": "<path>"}'
        )
    return KeyOrderOption(tiers, state_file)


def _secret_options(raw: str | None) -> tuple[str, ...]:
    """The names in option `retrylib.secretOptions` (a JSON list of strings; none if unset)."""
    if raw is None:
        return ()
    try:
        names = json.loads(raw)
    except ValueError:
        names = None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"option {OPTION_SECRET_OPTIONS} must be a JSON list of option names")
    return tuple(names)


def _offsets_option(
    options: Mapping[str, str], name: str, topics: list[str], pattern: str | None
) -> Offsets | None:
    """Offsets JSON of subscribed topics (named, or matching `pattern`); raises `ValueError`
    naming the option and the fault."""
    raw = options.get(name.lower())
    if raw is None:
        return None
    try:
        parsed = json.loads(raw)
    except ValueError as e:
        raise ValueError(f"option {name}={raw!r} is not JSON: {e}") from e
    offsets = offsets_from_json(parsed, what=f"option {name}")
    unknown = sorted({topic for topic, _ in offsets if not subscribed(topic, topics, pattern)})
    if unknown:
        raise ValueError(f"option {name} names topic(s) {unknown} that are not subscribed")
    return offsets


def _topic_delays(raw: str | None, topics: list[str]) -> dict[str, int]:
    """`retrylib.topicDelaysMs` parsed; raises `ValueError` naming the bad entry."""
    if raw is None:
        return {}
    try:
        delays = json.loads(raw)
    except ValueError:
        delays = None
    if not isinstance(delays, dict):
        raise ValueError(
            f"option {OPTION_TOPIC_DELAYS_MS}={raw!r} must be a JSON object of topic: delay ms"
        )
    for topic, delay in delays.items():
        if topic not in topics:
            raise ValueError(
                f"option {OPTION_TOPIC_DELAYS_MS} names {topic!r}, which is not subscribed"
            )
        if type(delay) is not int or delay < 0:
            raise ValueError(
                f"option {OPTION_TOPIC_DELAYS_MS}: the delay of {topic!r} must be an integer "
                f">= 0, got {delay!r}"
            )
    return delays


def _int_option(options: Mapping[str, str], name: str, minimum: int) -> int | None:
    raw = options.get(name.lower())
    if raw is None:
        return None
    try:
        value = int(str(raw).strip())
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise ValueError(f"option {name}={raw!r} must be an integer >= {minimum}")
    return value
