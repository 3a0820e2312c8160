"""The query's source frame: the options of the sources that read the main topics and the
delayed topics (a handler job's retry tiers, a delay router's delay topics), and where an
availableNow run ends."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession

from retrylib.config.model import AnyConfig, KafkaConfig
from retrylib.config.topic_names import subscribed
from retrylib.kafka.offsets import Offsets, offsets_to_json
from retrylib.kafka.reading import Reading, reading_options
from retrylib.source.kafka_source import KafkaStreamReader
from retrylib.source.main_reader import CONNECTOR
from retrylib.source.options import (
    OPTION_AVAILABLE_NOW_OFFSETS,
    OPTION_KEY_ORDER,
    parse_source_options,
)
from retrylib.spark.flavour import flavour_of

log = logging.getLogger(__name__)


def builtin_kafka_available(spark: SparkSession) -> bool:
    """True when Spark's own Kafka connector is on the classpath (Databricks, EMR, --packages).

    Asks Spark to resolve the "kafka" format as a query would: jars added with `--jars` are
    loaded by Spark's class loader, which a plain `Class.forName` from Py4J does not see. A
    Spark Connect client asks the server for the schema of a Kafka stream (no broker is
    asked: the schema is fixed).
    """
    return flavour_of(spark).kafka_connector_available(spark)


def _read_kafka(spark: SparkSession, format_name: str, options: dict[str, str]) -> DataFrame:
    return spark.readStream.format(format_name).options(**options).load()


def source_options(config: AnyConfig) -> tuple[dict[str, str], dict[str, str]]:
    """The options of Spark's Kafka source for the main topics (Java client options) and of
    the retry tiers' `retrylib_kafka` source (librdkafka's).

    `kafka.max_offsets_per_trigger` bounds both, so a retry backlog is read in batches too.
    """
    kafka = config.kafka
    delays = config.delayed_topics()
    common = {
        "kafka.bootstrap.servers": kafka.bootstrap_servers,
        "failOnDataLoss": str(kafka.fail_on_data_loss).lower(),
    }
    if kafka.max_offsets_per_trigger:
        common["maxOffsetsPerTrigger"] = str(kafka.max_offsets_per_trigger)
    main = {
        **_client_options(reading_options(kafka.spark_options(), Reading.MAIN_TOPICS)),
        **common,
        **_subscription(kafka),
        **_starting_options(kafka),
    }
    if kafka.starting_timestamp_ms is not None:
        # A partition with no record from then on starts at its end, not fails the query.
        main["startingOffsetsByTimestampStrategy"] = "latest"
    tiers = {
        **_client_options(reading_options(kafka.client_options(), Reading.DELAYED_TOPICS)),
        **common,
        "subscribe": ",".join(sorted(delays)),
        "retrylib.topicDelaysMs": json.dumps(delays),
        "retrylib.readAheadMs": str(config.read_ahead_ms()),
        "retrylib.tierStampsAhead": str(config.stamps_delayed_topics_ahead()).lower(),
        "retrylib.secretOptions": json.dumps(config.secret_options()),
    }
    return main, tiers


def _subscription(kafka: KafkaConfig, *tiers: str) -> dict[str, str]:
    """The source options naming the main topics (or their pattern) and `tiers`."""
    topics = {"subscribe": ",".join([*kafka.topics, *tiers])} if kafka.topics or tiers else {}
    if kafka.topic_pattern is not None:
        topics["subscribePattern"] = kafka.topic_pattern
    return topics


def _starting_options(kafka: KafkaConfig) -> dict[str, str]:
    """Where a new query starts reading the main topics, in the options of both sources.

    From a time: on each partition the first record at or after it, or the partition's end
    when there is none.
    """
    if kafka.starting_timestamp_ms is None:
        return {"startingOffsets": kafka.starting_offsets}
    return {"startingTimestamp": str(kafka.starting_timestamp_ms)}


def _client_options(options: dict[str, str]) -> dict[str, str]:
    """Kafka client `options` as a Kafka source's "kafka."-prefixed options."""
    return {f"kafka.{key}": value for key, value in options.items()}


def _every_topic(config: AnyConfig) -> dict[str, str]:
    """One `retrylib_kafka` source's options for the main topics and the tiers together."""
    _, tiers = source_options(config)
    subscription = _subscription(config.kafka, *sorted(config.delayed_topics()))
    return {**tiers, **subscription, **_starting_options(config.kafka)}


def available_now_target(config: AnyConfig) -> Offsets:
    """Where an availableNow run of the job ends: every main topic partition's latest
    (committed) offset and every tier partition's delay frontier, now.

    Raises `TopicError` naming a topic that does not exist.
    """
    reader = KafkaStreamReader(parse_source_options(_every_topic(config)))
    try:
        return reader.available_end()
    finally:
        reader.stop()


def _held_to(options: dict[str, str], target: Offsets | None) -> dict[str, str]:
    """`options` of a `retrylib_kafka` source, told to read no further than `target`."""
    if target is None:
        return options
    topics = options.get("subscribe", "").split(",")
    pattern = options.get("subscribePattern")
    mine = {key: offset for key, offset in target.items() if subscribed(key[0], topics, pattern)}
    return {**options, OPTION_AVAILABLE_NOW_OFFSETS: json.dumps(offsets_to_json(mine))}


def source_frame(
    spark: SparkSession,
    config: AnyConfig,
    reader: str,
    range_groups: int,
    available_now_offsets: Offsets | None = None,
    breaker_file: Path | None = None,
    key_order: dict[str, object] | None = None,
) -> DataFrame:
    """Every topic the job reads: the main topics, and the retry tiers up to what is due.

    `reader` (`retrylib.source.main_reader`) "python": one `retrylib_kafka` source for all
    of them, emitting offset ranges (`retrylib.emit = ranges`) that the routing tasks read
    themselves: records skip the JVM, and `maxOffsetsPerTrigger` bounds a batch, retries
    included. "builtin": the main topics come from Spark's Kafka connector as records, in a
    union with one `retrylib_kafka` source for the tiers, emitting records too.
    `range_groups`: the input partitions of the python reader, one per executor core.
    `available_now_offsets` holds the `retrylib_kafka` source to them (an availableNow run
    on Spark 4.0/4.1); `breaker_file` holds its main topics while the breaker is open;
    `key_order` (`HandlerJob.key_order_option`) has it plan key groups with a key-ordered
    job's queues.
    """
    main, tiers = source_options(config)
    if reader == CONNECTOR:
        log.info("main topics read with Spark's built-in kafka source")
        frame = _read_kafka(spark, "kafka", {**main, "includeHeaders": "true"})
        if not config.delayed_topics():
            return frame
        return frame.unionByName(
            _read_kafka(spark, "retrylib_kafka", _held_to(tiers, available_now_offsets))
        )
    log.info("topics read with the retrylib_kafka Python data source")
    every_topic = {
        **_every_topic(config),
        "retrylib.emit": "ranges",
        # One input partition per core: Spark pays a Python round trip per input partition.
        "retrylib.rangeGroups": str(range_groups),
    }
    if breaker_file is not None:
        every_topic["retrylib.breakerFile"] = str(breaker_file)
    if key_order is not None:
        every_topic[OPTION_KEY_ORDER] = json.dumps(key_order)
    return _read_kafka(spark, "retrylib_kafka", _held_to(every_topic, available_now_offsets))
