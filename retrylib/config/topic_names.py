"""Names of topics and the rules that match them, shared by the config parser, the Kafka
clients and every Spark Python process that reads Kafka: nothing here imports the rest of
the config package, so a source process does not load the config model to use them."""

from __future__ import annotations

import re
from collections.abc import Collection

ANY_TOPIC = "*"
"""The main-topic key of the retry tiers of a job reading `kafka.topic_pattern`: one set of
tiers for every topic it matches ("*" is no Kafka topic name)."""

CONTROL_TOPIC_PREFIX = "_retrylib."
"""Every job's control topics start with it; no record is ever forwarded to one."""


def subscribed(topic: str, topics: Collection[str], pattern: str | None) -> bool:
    """Whether a reader of `topics` and of every topic whose whole name matches `pattern`
    (`kafka.topic_pattern`, a `subscribePattern`; None for none) reads `topic`."""
    return topic in topics or (pattern is not None and re.fullmatch(pattern, topic) is not None)


def produced_topic(job_name: str) -> str:
    """The one-partition topic holding the markers of the produced units of each batch."""
    return f"{CONTROL_TOPIC_PREFIX}{job_name}.produced"


def redriven_topic(job_name: str) -> str:
    """The one-partition topic holding the id of every committed redrive of the job."""
    return f"{CONTROL_TOPIC_PREFIX}{job_name}.redriven"
