"""The topics a job creates when missing (if allowed): one `ensure_topics` for both kinds of job."""

from __future__ import annotations

from confluent_kafka.admin import AdminClient

from retrylib.config.model import AnyConfig
from retrylib.config.topic_names import produced_topic
from retrylib.kafka.clients import ensure_topics, partition_counts

TIER_CLOCK_ALLOWANCE_MS = 300_000
"""How far past one tier delay a tier record's timestamp may lie ahead of the broker's clock.

The job writes a tier record with a timestamp at most one delay after it writes it
(`retry.policy.tier_timestamp_ms`); a tier releases records in offset order, so a record
with a later timestamp holds back every record behind it. A tier topic the job creates has
`message.timestamp.after.max.ms` = delay + this allowance (for clocks that disagree), so
the broker refuses anyone's record that would hold a tier partition up for longer.
"""


def create_missing(
    admin: AdminClient,
    config: AnyConfig,
    wanted: dict[str, int],
    optional_configs: dict[str, dict[str, str]] | None = None,
) -> dict[str, int]:
    """`ensure_topics` for `wanted` (topic -> partitions) with [kafka.new_topics]'s replication
    and configs, and for the control topic: one partition, the replication only
    (`NewTopics`). Returns the partition count of each of them."""
    kafka = config.kafka
    settings = kafka.new_topics
    topics = {**wanted, produced_topic(config.job.name): 1}
    ensure_topics(
        admin,
        topics,
        create=kafka.create_topics,
        configs=dict.fromkeys(wanted, settings.configs),
        optional_configs=optional_configs,
        replication_factor=settings.replication_factor,
    )
    return partition_counts(admin, topics)
