"""Reading [retry] and [delay_router], the two tables that delay records: a handler job's
retry tiers, and a delay router's topics. Both take `read_ahead` (`read_ahead_ms`).

Each reader returns None when anything it checked was a problem (recorded in `t.problems`).
"""

from __future__ import annotations

import json

from retrylib.config.model import ANY_TOPIC, DelayRouterConfig, RetryConfig
from retrylib.config.topic_names import produced_topic, redriven_topic
from retrylib.config.topics import explicit_tiers, template_tiers
from retrylib.config.values import (
    BOOL,
    EXCEPTION_REF,
    NON_EMPTY_LIST,
    PERCENT,
    POSITIVE_INT,
    TEXT,
    TOPIC,
    TOPIC_TEMPLATE,
    Table,
    is_topic,
)

_DEFAULT_DELAYS = ("10s", "1m", "10m")
# A retry due within this of a batch's start is read in that batch and waits in its task, so
# it is handled on time rather than a batch later; about a batch's length on a small cluster.
DEFAULT_READ_AHEAD = "2s"
# As Kafka's brokers accept a CreateTime ahead of their clock (log.message.timestamp.after.max.ms).
DEFAULT_MAX_TIMESTAMP_AHEAD = "1h"
_MAX_READ_AHEAD_MS = 60_000  # a record read ahead holds its task's slot until it is due
_DEFAULT_TOPIC_TEMPLATE = "{topic}.{job}.retry.{delay}"
_PATTERN_TOPIC_TEMPLATE = "{job}.retry.{delay}"  # kafka.topic_pattern: the job's own tiers
_MIN_DEFAULT_MAX_RETRY_AFTER_MS = 3_600_000


def read_ahead_ms(t: Table) -> int | None:
    """`read_ahead` of [retry] or [delay_router]: how long before they are due the job reads
    its delayed topics' records, which then wait in their task (`retrylib.task.read_ahead`),
    or a delay router's in its batch's produce (`retrylib.task.forwarding`)."""
    read_ahead = t.duration("read_ahead", 'read_ahead = "2s"', DEFAULT_READ_AHEAD, positive=False)
    if read_ahead is not None and read_ahead > _MAX_READ_AHEAD_MS:
        t.problems.add(
            t.path("read_ahead"),
            "at most 1m: a record read ahead holds its batch until it is due; "
            'write it like "2s", or "0s" to read only what is due',
        )
        return None
    return read_ahead


def read_retry(
    t: Table, main_topics: tuple[str, ...] | None, job_name: str | None
) -> RetryConfig | None:
    texts = t.get("delays", NON_EMPTY_LIST, 'delays = ["5s", "1m", "10m"]', [*_DEFAULT_DELAYS])
    delays = [
        t.problems.duration(f"{t.path('delays')}[{i}]", text, positive=True)
        for i, text in enumerate(texts or ())
    ]
    max_attempts = t.get("max_attempts", POSITIVE_INT, "max_attempts = 4", 4)
    jitter = t.get("jitter", PERCENT, 'jitter = "10%"', "0%")
    non_retryable = t.strings(
        "non_retryable", EXCEPTION_REF, 'non_retryable = ["ValueError"]', [], empty_ok=True
    )
    explicit = t.strings("topics", TOPIC, 'topics = ["orders.retry.5s", "orders.retry.1m"]', None)
    default_template = (
        _PATTERN_TOPIC_TEMPLATE if main_topics == (ANY_TOPIC,) else _DEFAULT_TOPIC_TEMPLATE
    )
    template_example = f"topic_template = {json.dumps(default_template)}"
    template = t.get("topic_template", TOPIC_TEMPLATE, template_example, default_template)
    max_retry_after = t.duration("max_retry_after", 'max_retry_after = "6h"', None, positive=True)
    timeout = t.duration("timeout", 'timeout = "1h"', None, positive=True)
    key_ordered = t.get("key_ordered", BOOL, "key_ordered = true", False)
    read_ahead = read_ahead_ms(t)
    t.finish()
    tiers = None
    if main_topics is not None and job_name and texts is not None and None not in delays:
        if explicit is not None:
            tiers = explicit_tiers(t, delays, main_topics, explicit)
        elif template is not None and "topics" not in t.data:
            tiers = template_tiers(t, delays, main_topics, job_name, template)
    t.values["tiers"] = tiers
    if not t.ok or tiers is None:
        return None
    if max_retry_after is None:
        max_retry_after = max(_MIN_DEFAULT_MAX_RETRY_AFTER_MS, *delays)
    return RetryConfig(
        tuple(delays),
        max_attempts,
        float(jitter[:-1]) / 100,
        non_retryable,
        tiers,
        max_retry_after,
        timeout,
        bool(key_ordered),
        read_ahead,
    )


def check_key_order(t: Table, source: str | None, handler_kind: str | None) -> None:
    """`retry.key_ordered` holds records inside retrylib's own Kafka source's tasks, which
    `kafka.source = "python"` selects, and decides record by record."""
    if not t.values.get("key_ordered"):
        return
    if source is not None and source != "python":
        t.problems.add(
            t.path("key_ordered"),
            f'needs kafka.source = "python" (it is "{source}"): only retrylib\'s own Kafka '
            'source reads each key\'s partitions in one task; set kafka.source = "python" or '
            "remove retry.key_ordered",
        )
    if handler_kind is not None and handler_kind != "record":
        t.problems.add(
            t.path("key_ordered"),
            f'needs handler.kind = "record" (it is "{handler_kind}"): a key\'s records are '
            "held one by one; use a record handler or remove retry.key_ordered",
        )


def read_delay_router(t: Table, job_name: str | None) -> DelayRouterConfig | None:
    """[delay_router]: the delay topics with their delays, the two header names, and the
    fallback topic, which may not be one of the delay topics or the job's control topics."""
    example = '[delay_router.topics] "retry_topic_5min" = "5m"'
    topics = t.table("topics", example, required=True)
    delays = {}
    for name in topics.data:
        if not is_topic(name):
            topics.refuse(name, f"{TOPIC.noun} is needed, got {json.dumps(name)}; {example}")
        else:
            delays[name] = topics.duration(name, example, None, positive=True)
    if not topics.data and not topics.broken:
        t.problems.add(t.path("topics"), f"names no delay topic; add one, as {example}")
    target = t.get("target_header", TEXT, 'target_header = "final_topic"', "final_topic")
    stamp = t.get("timestamp_header", TEXT, 'timestamp_header = "msg_ts"', "msg_ts")
    fallback = t.get("fallback_topic", TOPIC, 'fallback_topic = "retry_fallback"', None)
    read_ahead = read_ahead_ms(t)
    max_ahead = t.duration(
        "max_timestamp_ahead",
        'max_timestamp_ahead = "1h"',
        DEFAULT_MAX_TIMESTAMP_AHEAD,
        positive=True,
    )
    t.finish()
    if target is not None and target == stamp:
        t.problems.add(
            t.path("timestamp_header"),
            f"is the same header as target_header ({json.dumps(target)}); name another one",
        )
    if fallback in delays:
        t.problems.add(
            t.path("fallback_topic"),
            f"{json.dumps(fallback)} is a delay topic: a record with no destination would go "
            "round it for ever; name a topic that is not in delay_router.topics",
        )
    if job_name is not None:
        control = {produced_topic(job_name), redriven_topic(job_name)}
        for name in [*delays, fallback]:
            if name in control:
                t.problems.add(
                    t.path("topics" if name in delays else "fallback_topic"),
                    f"{json.dumps(name)} is the job's control topic; choose another topic",
                )
    if not t.ok or None in delays.values() or read_ahead is None or max_ahead is None:
        return None
    return DelayRouterConfig(delays, target, stamp, fallback, read_ahead, max_ahead)
