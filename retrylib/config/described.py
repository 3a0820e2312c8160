"""What a config turns on beyond the plain flow, in the words `retrylib check` prints: each
job kind's `describe()`."""

from __future__ import annotations

from retrylib.config.durations import format_duration
from retrylib.config.model import BreakerConfig, Config, DelayRouterConfig


def describe_router(router: DelayRouterConfig) -> str:
    """What a delay router does, in one line of `retrylib check`."""
    topics = ", ".join(
        f"{topic} ({format_duration(delay)})" for topic, delay in router.topics.items()
    )
    no_destination = (
        f"to {router.fallback_topic}"
        if router.fallback_topic is not None
        else "logged at ERROR and counted (no fallback_topic)"
    )
    return (
        f"delay router: records of {topics} go to the topic in their {router.target_header} "
        f"header once {router.timestamp_header} (epoch seconds) + the delay has passed; "
        f"records with no such topic {no_destination}"
    )


def describe_handler_job(config: Config) -> list[str]:
    """`retrylib check`'s lines for what a handler job's config turns on beyond the plain
    flow: lanes, key order, the breaker, hooks."""
    lines = []
    if config.handler.parallelism > 1:
        lines.append(
            f"handler: {config.handler.parallelism} lanes per Spark task (handler.parallelism): "
            "calls for different keys at once, each key's records one at a time, in order"
        )
    if config.retry.key_ordered:
        lines.append(
            "retry: key-ordered (retry.key_ordered): while a record waits in a retry tier, "
            "its key's later records in its partition wait behind it"
        )
    if config.breaker is not None:
        lines.append(describe_breaker(config.breaker))
    hooks = config.hooks.references()
    if hooks:
        lines.append("hooks import: " + ", ".join(f"{name} = {ref}" for name, ref in hooks.items()))
    return lines


def describe_breaker(breaker: BreakerConfig) -> str:
    """`retrylib check`'s line for `[breaker]`."""
    return (
        f"breaker: opens when {breaker.failure_share:.0%} of the last {breaker.window} "
        "main-topic records failed, then holds the main topics (retry tiers go on) and lets "
        f"{breaker.probe_records} through every {format_duration(breaker.probe_every_ms)} "
        "until a probe passes"
    ) + _describe_health(breaker)


def _describe_health(breaker: BreakerConfig) -> str:
    if breaker.health is None:
        return ""
    return (
        f"; paused while {breaker.health}() says down (asked every "
        f"{format_duration(breaker.health_every_ms)}, within "
        f"{format_duration(breaker.health_timeout_ms)})"
    )
