"""`retrylib check`'s preflight: what would stop a valid config's job from starting.

The broker answers; the main topics exist; the retry, dead-letter and control topics exist or
the job may create them; with `tables`, existing Delta tables have the columns the job writes.
Nothing here changes anything, and Spark is only started for the tables.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import ClusterMetadata

from retrylib.config.model import AnyConfig, Config
from retrylib.config.topic_names import produced_topic
from retrylib.errors import RetrylibError
from retrylib.job.kinds import JobKind, kind_of
from retrylib.kafka.clients import kafka_error_text, login_refusal
from retrylib.kafka.reading import KafkaOffsets
from retrylib.sinks.log_store import single_driver_only, spark_setting
from retrylib.source.stranded import stranded_retries
from retrylib.spark.session import tool_session
from retrylib.state.checkpoint import Checkpoint
from retrylib.state.files import on_driver_disk

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass(frozen=True)
class Finding:
    """One line of `retrylib check`: level is "ok", "note", "warning" or "error"."""

    level: str
    message: str


def preflight(
    config: AnyConfig,
    *,
    timeout: float = 5.0,
    spark: SparkSession | None = None,
    tables: bool = False,
) -> tuple[bool, list[Finding]]:
    """What would stop the job from starting, beyond the config itself: whether the broker
    answers within `timeout`, the main topics exist and the other topics exist or may be
    created; with `tables`, also that existing tables have the expected columns (read
    through `spark`, or `tool_session()` when it is None: only then is Spark started).
    Returns (broker reachable, findings); changes nothing.
    """
    kind = kind_of(config)
    reachable, findings = _topic_findings(kind, timeout)
    if tables:
        if spark is None:
            spark = tool_session(f"retrylib-check-{config.job.name}")
        findings += _table_findings(spark, kind)
    if reachable and kind.retries:
        findings += _stranded_findings(kind.config, spark)
    return reachable, findings


def _stranded_findings(config: Config, spark: SparkSession | None) -> list[Finding]:
    """An error per retry topic taken out of retry.delays with records still in it
    (`retrylib.source.stranded`), read from the checkpoint's last planned offsets."""
    if spark is None and not on_driver_disk(None, config.job.checkpoint):
        return [
            Finding(
                "note",
                "retry topics taken out of retry.delays not checked: the checkpoint is read "
                "through Spark (check --tables reads it)",
            )
        ]
    try:
        position = Checkpoint(config.job.checkpoint).check_offsets_log(spark)
        stranded = stranded_retries(config, position)
    except RetrylibError as e:
        return [Finding("error", str(e))]
    return [Finding("error", s.refusal()) for s in stranded]


def _topic_findings(kind: JobKind, timeout: float) -> tuple[bool, list[Finding]]:
    config = kind.config
    kafka = config.kafka
    shown_servers = config.redacted()["kafka"]["bootstrap_servers"]
    errors: list[KafkaError] = []
    lookups = KafkaOffsets(
        kafka.bootstrap_servers, kafka.client_options(), timeout=timeout, errors=errors
    )
    required, others = kind.required_topics(), _created_topics(kind)
    named = [*(topic for topic, _, _ in required), *(topic for topic, _ in others)]
    try:
        found = lookups.partitions(named, kafka.topic_pattern)
    except KafkaException as e:
        lookups.serve_errors()
        refused = login_refusal(errors, shown_servers, config.kafka_login())
        if refused is not None:
            return False, [Finding("error", refused)]
        reason = errors[0].str() if errors else kafka_error_text(e)
        message = f"broker {shown_servers} not reachable within {timeout:g}s ({reason})"
        return False, [Finding("warning", f"{message}; topics not checked")]
    # Each topic with what to say when it is missing: a main or delay topic must exist; the
    # others may be created by the job when kafka.create_topics allows it.
    wanted = [
        (
            topic,
            label,
            Finding(
                "error",
                f"{key}: topic {topic!r} does not exist on {shown_servers}; "
                "create it before starting the job",
            ),
        )
        for topic, label, key in required
    ]
    for topic, label in others:
        if kafka.create_topics:
            missing = Finding("note", f"{label} does not exist; created when the job starts")
        else:
            missing = Finding(
                "error",
                f"{label} does not exist and kafka.create_topics = false; create it "
                "or set kafka.create_topics = true",
            )
        wanted.append((topic, label, missing))
    findings = [Finding("ok", f"broker {shown_servers} reachable")]
    if kafka.topic_pattern is not None:
        matched = [topic for topic in found if topic not in named]
        findings += [
            Finding(
                "ok",
                f"main topic {topic!r} (matches kafka.topic_pattern): "
                f"{len(found[topic])} partitions",
            )
            for topic in matched
        ]
        if not matched:
            findings.append(
                Finding(
                    "warning",
                    f"kafka.topic_pattern {kafka.topic_pattern!r} matches no topic on "
                    f"{shown_servers} yet; the job reads each one it matches once it exists",
                )
            )
    for topic, label, missing in wanted:
        if topic in found:
            findings.append(Finding("ok", f"{label}: {len(found[topic])} partitions"))
        else:
            findings.append(missing)
    findings += single_copy_findings(lookups.admin.list_topics(timeout=timeout), others)
    return True, findings


def single_copy_findings(metadata: ClusterMetadata, topics: list[tuple[str, str]]) -> list[Finding]:
    """A warning for each of `topics` ((topic, label)) that has a partition with one replica
    on a cluster of several brokers: losing that broker loses the retries it holds."""
    brokers = len(metadata.brokers)
    if brokers < 2:
        return []
    findings = []
    for topic, label in topics:
        info = metadata.topics.get(topic)
        if info is None or info.error is not None or not info.partitions:
            continue
        if min(len(partition.replicas) for partition in info.partitions.values()) == 1:
            findings.append(
                Finding(
                    "warning",
                    f"{label} keeps one copy of its records on a cluster of {brokers} brokers: "
                    "losing its broker loses them. Raise its replication (Kafka's "
                    "kafka-reassign-partitions), and leave kafka.new_topics.replication_factor "
                    "unset or above 1 for the topics the job creates",
                )
            )
    return findings


def _created_topics(kind: JobKind) -> list[tuple[str, str]]:
    """(topic, label) of each topic the job creates when missing (if allowed): the kind's
    (retry tiers and dead-letter topics, or a delay router's fallback topic), then the
    control topic."""
    control = produced_topic(kind.config.job.name)
    return [*kind.created_topics(), (control, f"control topic {control!r}")]


def _table_findings(spark: SparkSession, kind: JobKind) -> list[Finding]:
    """One finding per table: missing (a note: the job creates it), matching, unreadable (a
    warning), or not what the job writes (an error naming every column difference).
    """
    from retrylib.batch.metrics import metrics_struct
    from retrylib.sinks.tables import column_differences, read_table, table_exists

    wanted = kind.tables()
    metrics = kind.config.metrics.table_ref()
    if metrics is not None:
        wanted.append(("metrics.table", metrics, metrics_struct()))
    findings = []
    if kind.dead_letter is not None:
        why = single_driver_only(kind.dead_letter.table_ref(), spark_setting(spark))
        if why is not None:  # the table `redrive` updates while the job appends to it
            findings.append(
                Finding(
                    "warning",
                    f"dead_letter.table: redrive runs only while the job is stopped: {why}",
                )
            )
    for key, table, schema in wanted:
        try:
            if not table_exists(spark, table):
                findings.append(Finding("note", f"{key}: no Delta table {table}; created on start"))
                continue
            differences = column_differences(read_table(spark, table).schema, schema)
        except RetrylibError as e:  # a catalog table that is not a Delta table
            findings.append(Finding("error", f"{key}: {e}"))
            continue
        except Exception as e:  # object-store credentials, permissions, a broken log
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            findings.append(Finding("warning", f"{key}: cannot read the table {table}: {reason}"))
            continue
        if not differences:
            findings.append(Finding("ok", f"{key}: Delta table {table}"))
        else:
            findings.append(
                Finding(
                    "error",
                    f"{key}: the table {table} {differences}; point {key} at a new table "
                    "or migrate this one",
                )
            )
    return findings
