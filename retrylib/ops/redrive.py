"""`retrylib redrive`: send dead-lettered records back to a main topic, each exactly once.

A record goes back with its key, value and own headers (any `retrylib.*` header dropped),
to its origin topic (and origin partition) or to the topic given; the job then reads it as a
new record, with fresh attempts. Which rows go is chosen by time range (`dead_lettered_at`),
error class, id, origin topic, partition and offsets, and key, at most a number of them
(the oldest); rows already redriven never go again.

Exactly once, across a crash at any point, in three steps:

1. Claim: one Delta UPDATE sets `redrive_id` (fresh for this run) and `redrive_topic` on
   every chosen row not claimed before. Rows with a `redrive_id` belong to that redrive.
2. Send: one Kafka transaction (transactional.id "retrylib-redrive-<job>") produces the
   claimed rows and a marker, the redrive id, to the control topic
   `_retrylib.<job>.redriven`. Records and marker become visible together or not at all.
3. Confirm: one Delta UPDATE sets `redriven_at` on the redrive's rows.

A run first finishes what an earlier one left: claimed rows without `redriven_at` are
confirmed when their redrive's marker is committed (the crash came after the send), and
sent (with the same id and marker) when it is not (the crash came before or during it).
Opening the transactional producer first fences a stale instance and settles its
in-flight transaction, so the markers read afterwards are final. Consumers that must not
see the records of an aborted send read with `isolation.level = read_committed`, as the
job reads its main topics unless the user's Kafka options set another, and its own topics
(tiers, delay and control topics) whatever they say (`kafka.reading.reading_options`).

The dead-letter table (a path or a catalog name) is read and updated through Spark's Delta
(`retrylib.sinks.dead_letter_table`); an UPDATE that loses a race with another commit (an
OPTIMIZE, a second redrive) is run again, a few times. The job's own appends of dead letters
are blind appends, which Delta lets an UPDATE commit beside. A table the job has not created
yet holds nothing to redrive.

One redrive per job runs at a time: each holds the job's redrive lease (a Kafka consumer
group, `retrylib.kafka.runner_lease`) from before it reads the claimed rows until it is
done, and a second one started meanwhile is refused (`LeaseHeld`, naming the first) before
it claims anything. A redrive that died frees the lease within the lease's session timeout.
Where only one driver at a time may write the table (S3 with open-source Delta's default log
store), a redrive also holds the job's runner lease: it runs only while the job is stopped
(`retrylib.ops.redrive_leases`).

Target topics are checked before rows are claimed; if a claimed row's topic disappears
before it is sent, every run fails on it until the topic exists again, or until its claim
is released by hand (set `redrive_id` and `redrive_topic` back to null for that redrive id,
which is only safe when its marker is not in the control topic).
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaError, KafkaException

from retrylib.config.model import AnyConfig, Config
from retrylib.config.topic_names import redriven_topic
from retrylib.errors import RedriveError
from retrylib.job.kinds import kind_of
from retrylib.kafka.clients import (
    connected_admin,
    make_producer,
    partition_counts,
)
from retrylib.kafka.reading import ReadToEnd, produce, reading_consumer
from retrylib.ops.redrive_leases import redrive_leases
from retrylib.retry.headers import redriven_headers
from retrylib.sinks.dead_letter_table import SHOWN_COLUMNS, DeadLetterTable, redriven_at_least
from retrylib.sinks.tables import sql_string, sql_timestamp, table_exists
from retrylib.spark.session import tool_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")
_TRANSACTION_TIMEOUT_MS = 900_000  # Kafka's default transaction.max.timeout.ms
PACED_SEND_S = 600
"""The longest a paced send (`--rate`) may take: its records go in one transaction, which
must commit well within `_TRANSACTION_TIMEOUT_MS`; a rate takes at most rate × this many
records a run."""

Progress = Callable[[int, int], None]
"""Called with (records sent so far, records to send) while sending."""


@dataclass(frozen=True)
class Selection:
    """Which dead-lettered rows to redrive: all conditions must hold; empty means any.

    `topics`, `partition` and `offsets` (first and last, both included) are of the record's
    origin; `keys` are record keys as UTF-8 text. `redrives_below` leaves out the records
    redriven that many times or more (`retrylib.redrives`), which came back each time.
    `limit` keeps the first rows of those the rest picks, in dead-letter order
    (`DeadLetterTable.rows`): a large replay goes in parts.
    """

    since: datetime | None = None
    until: datetime | None = None
    error_classes: tuple[str, ...] = ()
    ids: tuple[str, ...] = ()
    topics: tuple[str, ...] = ()
    keys: tuple[str, ...] = ()
    partition: int | None = None
    offsets: tuple[int, int] | None = None
    redrives_below: int | None = None
    limit: int | None = None

    def __post_init__(self) -> None:
        if self.offsets is not None and self.partition is None:
            raise RedriveError("--offsets: name the partition too (--partition)")
        if self.offsets is not None and self.offsets[0] > self.offsets[1]:
            raise RedriveError(
                f"--offsets: the first offset is after the last, got {self.offsets[0]}-"
                f"{self.offsets[1]}"
            )
        if self.limit is not None and self.limit < 1:
            raise RedriveError(f"--limit: at least 1, got {self.limit}")

    def predicate(self) -> str:
        """A Spark SQL condition over the dead-letter table for rows not claimed by any
        redrive (all but `limit`, which `DeadLetterTable.first` applies).

        An error class matches the stored class exactly ("builtins.ValueError") or by its
        last part ("ValueError").
        """
        parts = ["redrive_id IS NULL", "redriven_at IS NULL"]
        if self.since is not None:
            parts.append(f"dead_lettered_at >= {sql_timestamp(self.since)}")
        if self.until is not None:
            parts.append(f"dead_lettered_at < {sql_timestamp(self.until)}")
        if self.error_classes:
            classes = ", ".join(sql_string(c) for c in self.error_classes)
            short = " OR ".join(
                f"endswith(error_class, {sql_string('.' + c)})" for c in self.error_classes
            )
            parts.append(f"(error_class IN ({classes}) OR {short})")
        if self.ids:
            parts.append(f"id IN ({', '.join(sql_string(i) for i in self.ids)})")
        if self.topics:
            parts.append(f"origin_topic IN ({', '.join(sql_string(t) for t in self.topics)})")
        if self.keys:
            keys = ", ".join(f"CAST({sql_string(k)} AS BINARY)" for k in self.keys)
            parts.append(f"key IN ({keys})")
        if self.partition is not None:
            parts.append(f"origin_partition = {self.partition}")
        if self.offsets is not None:
            parts.append(f"origin_offset BETWEEN {self.offsets[0]} AND {self.offsets[1]}")
        if self.redrives_below is not None:
            parts.append(f"NOT {redriven_at_least(self.redrives_below)}")
        return " AND ".join(parts)

    def looping(self) -> str:
        """A Spark SQL condition for the rows the rest picks but `redrives_below` (set)
        leaves out."""
        assert self.redrives_below is not None, "only a guarded selection leaves rows out"
        unguarded = replace(self, redrives_below=None).predicate()
        return f"{unguarded} AND {redriven_at_least(self.redrives_below)}"

    def chosen(self, dead: DeadLetterTable) -> str:
        """`predicate`, narrowed to the first `limit` rows it picks when there is a limit."""
        if self.limit is None:
            return self.predicate()
        return dead.first(self.predicate(), self.limit)


@dataclass
class RedriveReport:
    """What a redrive did (or, dry, would do). Rows are dicts of `SHOWN_COLUMNS`."""

    dry_run: bool
    redrive_id: str | None = None
    selected: list[dict[str, Any]] = field(default_factory=list)
    resumed: list[dict[str, Any]] = field(default_factory=list)  # sent now for an earlier run
    confirmed: list[dict[str, Any]] = field(default_factory=list)  # sent by an earlier run
    sent: int = 0
    left: int = 0  # rows the filters pick that a limit or rate left for the next run
    looping: int = 0  # rows left out as redriven max_redrives times already (see --again)


def redrive(
    config: AnyConfig,
    selection: Selection,
    *,
    to: str | None = None,
    rate: float | None = None,
    again: bool = False,
    dry_run: bool = False,
    progress: Progress | None = None,
    spark: SparkSession | None = None,
) -> RedriveReport:
    """Redrive the rows `selection` picks, to `to` or each row's origin topic; see the module
    docstring. Records redriven `dead_letter.max_redrives` times already are left out (and
    counted) unless `again`. With `rate`, send at most that many records a second, and at
    most `PACED_SEND_S` seconds' worth a run. With `dry_run`, change nothing and report what
    would go. The table is read and updated through `spark`, or through `tool_session()` when it
    is None.

    Raises `RedriveError` for a bad `to`, a missing target topic, or a failed send,
    `TopicError` when the control topic is missing and may not be created, and `LeaseHeld`
    when another redrive of the job runs.
    """
    if to is not None and not _TOPIC.fullmatch(to):
        raise RedriveError(f"--to: not a Kafka topic name, got {to!r}")
    if rate is not None:
        if not rate > 0:
            raise RedriveError(f"--rate: records a second, more than 0, got {rate}")
        paced = max(1, int(rate * PACED_SEND_S))
        selection = replace(selection, limit=min(selection.limit or paced, paced))
    if kind_of(config).dead_letter is None:
        raise RedriveError(
            f"{config.source_path} is a delay router: it has no dead-letter table to redrive "
            "from (its records with no destination are on its fallback topic)"
        )
    table = config.dead_letter.table_ref()
    report = RedriveReport(dry_run=dry_run)
    if spark is None:
        spark = tool_session(f"retrylib-redrive-{config.job.name}")
    if not table_exists(spark, table):
        log.info("no dead-letter table %s: nothing to redrive", table)
        return report
    dead = DeadLetterTable(spark, table)
    if not again:
        selection = replace(selection, redrives_below=config.dead_letter.max_redrives)
        report.looping = dead.count(selection.looping())
    if dry_run:
        return _dry_run(config, dead, selection, to, report)
    kafka = config.kafka
    admin = connected_admin(kafka.bootstrap_servers, kafka.client_options(), config.kafka_login())
    with redrive_leases(spark, config, admin):
        sender = _Sender(config, admin, progress, rate)
        return _redrive_holding(config, dead, selection, to, report, sender)


def _redrive_holding(
    config: Config,
    dead: DeadLetterTable,
    selection: Selection,
    to: str | None,
    report: RedriveReport,
    sender: _Sender,
) -> RedriveReport:
    """`redrive` once the job's redrive lease is held: finish what an earlier run left, then
    claim, send and confirm the rows `selection` picks."""
    sender.open()  # fences a stale redrive and settles its transaction
    committed = committed_redrives(config)
    for redrive_id, rows in dead.claimed().items():
        if redrive_id in committed:
            _confirm(dead, redrive_id, committed[redrive_id])
            report.confirmed += [_shown(row) for row in rows]
        else:
            log.info("resending %d records of interrupted redrive %s", len(rows), redrive_id)
            report.sent += sender.send(redrive_id, rows)
            _confirm(dead, redrive_id, int(time.time() * 1000))
            report.resumed += [_shown(row) for row in rows]
    predicate = selection.chosen(dead)
    targets = [to] if to is not None else dead.origin_topics(predicate)
    if not targets:
        return report
    _refuse_retry_tiers(config, targets)
    # Before claiming, so that no row is claimed for a missing topic.
    sender.check_topics(targets, "create it" if to is not None else "create it or pass --to")
    report.redrive_id = uuid.uuid4().hex
    dead.update(
        predicate,
        {
            "redrive_id": sql_string(report.redrive_id),
            "redrive_topic": sql_string(to) if to is not None else "origin_topic",
        },
    )
    rows = dead.rows(f"redrive_id = {sql_string(report.redrive_id)}", full=True)
    if rows:
        report.sent += sender.send(report.redrive_id, rows)
        _confirm(dead, report.redrive_id, int(time.time() * 1000))
    report.selected = [_shown(row) for row in rows]
    if selection.limit is not None:
        report.left = dead.count(selection.predicate())
    return report


def _dry_run(
    config: Config,
    dead: DeadLetterTable,
    selection: Selection,
    to: str | None,
    report: RedriveReport,
) -> RedriveReport:
    """Fill `report` with the rows a real run would send or confirm; change nothing."""
    claimed = dead.claimed()
    committed = committed_redrives(config) if claimed else {}
    for redrive_id, rows in claimed.items():
        (report.confirmed if redrive_id in committed else report.resumed).extend(
            _shown(row) for row in rows
        )
    report.selected = [
        {**_shown(row), "redrive_topic": to or row["origin_topic"]}
        for row in dead.rows(selection.chosen(dead))
    ]
    if selection.limit is not None:
        report.left = dead.count(selection.predicate()) - len(report.selected)
    return report


def committed_redrives(config: Config) -> dict[str, int]:
    """Redrive id -> commit time (epoch ms) of every committed marker in the control topic."""
    kafka = config.kafka
    consumer = reading_consumer(kafka.bootstrap_servers, kafka.client_options(), "retrylib-redrive")
    topic = redriven_topic(config.job.name)
    markers: dict[str, int] = {}
    try:
        read = ReadToEnd.from_earliest(consumer, [(topic, 0)])
        for message in read.messages(timeout_s=60):
            markers[(message.value() or b"").decode()] = message.timestamp()[1]
        if read.unfinished:
            raise RedriveError(f"could not read the redrive markers in {topic} within 60s")
        return markers
    except KafkaException as e:
        if e.args and e.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            return markers
        raise
    finally:
        consumer.close()


def _refuse_retry_tiers(config: Config, targets: Iterable[str]) -> None:
    """Raises `RedriveError` when a target is one of the job's retry tiers.

    The job dead-letters a record on a tier that it cannot verify (`unverified_retry_record`,
    origin: the tier); sent back there unsigned it would only be dead-lettered again, and a
    main topic handles it as a new record.
    """
    tiers = set(config.retry.tier_topics())
    for topic in sorted(set(targets) & tiers):
        raise RedriveError(
            f"{topic!r} is a retry tier of job {config.job.name!r}: records sent there are "
            "not signed by the job and would be dead-lettered again; select rows with another "
            "origin, or pass --to <main topic> to have them handled as new records"
        )


class _Sender:
    """Produces claimed rows and their redrive's marker in one transaction, at most `rate`
    records a second (`Pace`)."""

    def __init__(
        self, config: Config, admin: Any, progress: Progress | None, rate: float | None
    ) -> None:
        self._config = config
        self._producer: Any = None
        self._admin = admin
        self._progress = progress
        self._rate = rate
        self._partitions: dict[str, int] = {}

    def open(self) -> None:
        """Make the job's transactional redrive producer, fencing a stale one."""
        kafka = self._config.kafka
        self._producer = make_producer(
            kafka.bootstrap_servers,
            {
                **kafka.client_options(),
                "transactional.id": f"retrylib-redrive-{self._config.job.name}",
                "transaction.timeout.ms": str(_TRANSACTION_TIMEOUT_MS),
            },
        )
        self._producer.init_transactions(30)

    def send(self, redrive_id: str, rows: Sequence[dict[str, Any]]) -> int:
        """Send `rows` and the marker `redrive_id`; returns the number of records sent.

        Raises `RedriveError` when a target topic is missing or the transaction fails
        (then aborted: nothing of it is visible to read_committed consumers).
        """
        self.check_topics(
            {row["redrive_topic"] for row in rows},
            f"create it: redrive {redrive_id} was interrupted, and its claimed records go there",
        )
        producer = self._producer
        pace = Pace(self._rate)
        producer.begin_transaction()
        try:
            for done, row in enumerate(rows, 1):
                pace.wait(done - 1)
                self._produce(row)
                if self._progress is not None and (done % 1000 == 0 or done == len(rows)):
                    self._progress(done, len(rows))
            produce(
                producer,
                redriven_topic(self._config.job.name),
                key=None,
                value=redrive_id.encode(),
                partition=0,
            )
            producer.commit_transaction(120)
        except KafkaException as e:
            try:
                producer.abort_transaction(30)
            except KafkaException:
                pass  # fenced or broker gone: the transaction times out on the broker
            raise RedriveError(f"redrive {redrive_id} failed, nothing was sent: {e}") from e
        log.info("redrive %s: %d records sent", redrive_id, len(rows))
        return len(rows)

    def check_topics(self, topics: Iterable[str], way_out: str) -> None:
        """Raises `RedriveError` naming the first of `topics` that does not exist, and
        `way_out`."""
        wanted = set(topics) - set(self._partitions)
        if not wanted:
            return
        found = partition_counts(self._admin, wanted)
        for topic in sorted(wanted):
            if topic not in found:
                raise RedriveError(
                    f"target topic {topic!r} does not exist on "
                    f"{self._config.kafka.bootstrap_servers}; {way_out}"
                )
            self._partitions[topic] = found[topic]

    def _produce(self, row: dict[str, Any]) -> None:
        topic = row["redrive_topic"]
        partition = row["origin_partition"]
        # Back to its own partition when it goes home, so per-key order holds there.
        partition_kept = (
            topic == row["origin_topic"]
            and partition is not None
            and 0 <= partition < self._partitions[topic]
        )
        headers = redriven_headers([(h["key"], h["value"]) for h in row["headers"] or ()])
        produce(
            self._producer,
            topic,
            key=row["key"],
            value=row["value"],
            headers=headers,
            partition=partition if partition_kept else None,
        )


class Pace:
    """Waits so that records go at most `rate` a second (no wait when `rate` is None)."""

    def __init__(
        self,
        rate: float | None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._rate = rate
        self._clock = clock
        self._sleep = sleep
        self._started: float | None = None

    def wait(self, sent: int) -> None:
        """Wait until the next record may go, `sent` having gone since the first."""
        if self._rate is None:
            return
        now = self._clock()
        if self._started is None:
            self._started = now
        ahead = self._started + sent / self._rate - now
        if ahead > 0:
            self._sleep(ahead)


def _shown(row: dict[str, Any]) -> dict[str, Any]:
    return {k: _utc(row.get(k)) for k in SHOWN_COLUMNS}


def _confirm(dead: DeadLetterTable, redrive_id: str, at_ms: int) -> None:
    at = datetime.fromtimestamp(at_ms / 1000, UTC)
    dead.update(
        f"redrive_id = {sql_string(redrive_id)} AND redriven_at IS NULL",
        {"redriven_at": sql_timestamp(at)},
    )


def _utc(value: Any) -> Any:
    """Timestamps (Spark gives them in the session's time zone) in UTC; other values as is."""
    return value.astimezone(UTC) if isinstance(value, datetime) else value
