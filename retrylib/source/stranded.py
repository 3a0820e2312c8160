"""Retry records stranded in a tier topic that left the config.

The source keeps its position in every topic it has read (`offsets.not_read`), so a tier
taken out of `retry.delays` is no longer read from that position on. What this job wrote
there after it would never be handled: a start that would leave such records behind is
refused (`retrylib run` and `retrylib check`), naming each topic, its count and the way out.
Records of other jobs sharing the topic, and a former main topic's records, are not this
job's retries (no `retrylib.job` header naming it) and are not counted.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from confluent_kafka import Consumer

from retrylib.config.model import Config
from retrylib.config.topic_names import subscribed
from retrylib.errors import RetrylibError
from retrylib.kafka.offsets import PartitionKey
from retrylib.kafka.reading import KafkaOffsets, ReadToEnd, reading_consumer
from retrylib.retry.headers import JOB, split_headers

SCAN_LIMIT = 100_000
"""Records read at most per topic and start; past it the count is a lower bound."""


@dataclass(frozen=True)
class Stranded:
    """`records` of this job's retries wait in `topic` after the job's position there;
    `exact` is False when the scan stopped (limit or time) before the end."""

    topic: str
    records: int
    exact: bool

    def refusal(self) -> str:
        count = f"{self.records}" if self.exact else f"at least {self.records}"
        return (
            f"retry topic {self.topic!r} is no longer in retry.delays, but {count} retry "
            "record(s) of this job wait in it and would never be handled: put its delay back "
            "in retry.delays until `retrylib status` shows the tier empty, then take it out"
        )


def stranded_retries(
    config: Config, position: Mapping[PartitionKey, int], timeout: float = 30.0
) -> list[Stranded]:
    """The topics of `position` (the job's last planned offsets) the config no longer reads
    that hold retries this job wrote after its position there, with their counts; all of it
    within `timeout` (a topic not read to its end by then is counted as far as it was)."""
    kafka = config.kafka
    read = {*kafka.topics, *config.retry.tier_topics()}
    left = {topic for topic, _ in position if not subscribed(topic, read, kafka.topic_pattern)}
    if not left:
        return []
    lookups = KafkaOffsets(kafka.bootstrap_servers, kafka.client_options(), timeout=timeout)
    found = lookups.partitions(sorted(left))  # a topic deleted since holds nothing
    keys = [key for key in position if key[1] in found.get(key[0], ())]
    latest = lookups.latest(keys)
    start = {key: position[key] for key in keys if latest[key] > position[key]}
    if not start:
        return []
    job = config.job.name.encode("utf-8")
    deadline = time.monotonic() + timeout
    consumer = reading_consumer(kafka.bootstrap_servers, kafka.client_options(), "retrylib-start")
    try:
        scans = (
            _scan(
                consumer,
                topic,
                {k: o for k, o in start.items() if k[0] == topic},
                latest,
                job,
                deadline,
            )
            for topic in sorted({topic for topic, _ in start})  # each scan when its turn comes
        )
        return [stranded for stranded in scans if stranded is not None]
    finally:
        consumer.close()


def _scan(
    consumer: Consumer,
    topic: str,
    start: Mapping[PartitionKey, int],
    end: Mapping[PartitionKey, int],
    job: bytes,
    deadline: float,
) -> Stranded | None:
    """This job's retries in `topic` from `start` to `end`, or None when there are none. A
    record with no retrylib job header ends the scan: a former main topic, not a tier (its
    backlog is not read at every start)."""
    count = 0
    scan = ReadToEnd(consumer, start, end)
    for message in scan.messages(timeout_s=max(0.0, deadline - time.monotonic()), limit=SCAN_LIMIT):
        _, own = split_headers(message.headers() or [])
        writer = own.get(JOB)
        if writer is None:
            return None
        count += writer == job
    exact = not scan.unfinished
    return Stranded(topic, count, exact) if count or not exact else None


def refuse_stranded_retries(config: Config, position: Mapping[PartitionKey, int]) -> None:
    """Raise `RetrylibError` with one line per topic when `stranded_retries` finds any."""
    stranded = stranded_retries(config, position)
    if stranded:
        raise RetrylibError("; ".join(s.refusal() for s in stranded))
