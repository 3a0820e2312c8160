"""Which Kafka client options a user may set in [kafka.options] and its kin: none the job sets
itself (`JOB_OWNED_OPTIONS`), and for librdkafka's clients only what librdkafka takes
(`option_problem`).
"""

from __future__ import annotations

_STARTING_TIME = 'a new job starts from a time with kafka.starting_offsets = "2026-11-01T08:00:00Z"'
_USE_TOPICS = (
    "the job subscribes to its retry tiers and kafka.topics (or kafka.topic_pattern); "
    "name the main topics there"
)
_SERIALIZED = "records are read and written as bytes; decode and encode them in the handler"
JOB_OWNED_OPTIONS = {
    "bootstrap.servers": "the brokers come from kafka.bootstrap_servers; set them there",
    "metadata.broker.list": "the brokers come from kafka.bootstrap_servers; set them there",
    "group.id": "retrylib names its own consumers' groups: it reads partitions by assignment "
    "and keeps its offsets in the checkpoint, never in a consumer group",
    "enable.auto.commit": "offsets are kept in the checkpoint and never committed to Kafka",
    "auto.offset.reset": "where a new job starts is kafka.starting_offsets; set it there",
    "enable.partition.eof": "retrylib turns it on and off per read",
    "transactional.id": "retrylib's producers use transactional ids of their own, derived "
    "from the checkpoint, for their exactly-once produce",
    "enable.idempotence": "retrylib's producers are always idempotent (no duplicates from "
    "their own retries)",
    "key.serializer": _SERIALIZED,
    "value.serializer": _SERIALIZED,
    "key.deserializer": _SERIALIZED,
    "value.deserializer": _SERIALIZED,
    "subscribe": _USE_TOPICS,
    "subscribePattern": _USE_TOPICS,
    "assign": _USE_TOPICS,
    "startingOffsets": "where a new job starts is kafka.starting_offsets; set it there",
    "startingTimestamp": _STARTING_TIME,
    "startingOffsetsByTimestamp": _STARTING_TIME,
    "startingOffsetsByTimestampStrategy": _STARTING_TIME,
    "failOnDataLoss": "set kafka.fail_on_data_loss, which every reader of the job follows",
    "maxOffsetsPerTrigger": "the cap per batch is kafka.max_offsets_per_trigger; set it there",
    "includeHeaders": "the job always reads record headers",
    "logger": "retrylib sends librdkafka's log lines through its own logging, which masks secrets",
}
"""Options the job sets on its clients (or on Spark's Kafka source) itself, each with what
to do instead: a user's value would silently replace the job's, or be ignored."""
_PROBE = "retrylib.probe"


def option_problem(name: str, value: str) -> str | None:
    """Why librdkafka refuses the client property `name` = `value` (an unknown name, a
    value it cannot parse), in its own words; None when it accepts it.

    Asks librdkafka itself, without creating a client or reaching a broker: the property
    is set on a configuration that ends with a name librdkafka does not know, so building
    the client always stops at that name, unless `name` or `value` failed before it.
    """
    # Imported here: loading a config without Kafka options needs no Kafka client library.
    from confluent_kafka import KafkaException, Producer

    try:
        Producer({name: value, _PROBE: ""})
    except KafkaException as e:
        reason = e.args[0].str()
        return None if _PROBE in reason else reason
    except (TypeError, ValueError) as e:  # confluent-kafka's own properties (callbacks)
        return str(e)
    return None
