"""The topics a job uses besides its main topics: the retry tiers' (named from retry.topics or
retry.topic_template), and the checks that each, and each control topic
(`topic_names`), is a topic of its own.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping

from retrylib.config.durations import format_duration
from retrylib.config.model import RetryTier
from retrylib.config.topic_names import ANY_TOPIC, produced_topic, redriven_topic, subscribed
from retrylib.config.values import TOPIC, Problems, Table, is_topic

_MAX_TOPIC_LENGTH = 249


def explicit_tiers(
    t: Table, delays: list[int], main_topics: tuple[str, ...], topics: tuple[str, ...]
) -> tuple[RetryTier, ...]:
    """Tiers from retry.topics: one topic per delay, for a single main topic."""
    key = t.path("topics")
    if "topic_template" in t.data:
        t.problems.add(key, "set together with retry.topic_template; keep only one of them")
    if len(main_topics) != 1:
        t.problems.add(
            key,
            f"needs exactly one main topic, but kafka.topics has {len(main_topics)} "
            f"({json.dumps(list(main_topics))}); use retry.topic_template instead",
        )
    if len(topics) != len(delays):
        t.problems.add(
            key,
            f"lists {len(topics)} topics for {len(delays)} delays; give one topic per entry of "
            "retry.delays",
        )
    tiers = tuple(
        RetryTier(i, delay, {main_topics[0]: topic})
        for i, (delay, topic) in enumerate(zip(delays, topics, strict=False))
    )
    _check_distinct_topics(
        t.problems,
        main_topics,
        tiers,
        lambda index, _: f"{key}[{index}]",
        "every main and retry topic must differ",
    )
    return tiers


def template_tiers(
    t: Table, delays: list[int], main_topics: tuple[str, ...], job_name: str, template: str
) -> tuple[RetryTier, ...]:
    """Tiers named by retry.topic_template for every main topic and delay."""
    key = t.path("topic_template")
    if main_topics == (ANY_TOPIC,) and "{topic}" in template:
        t.problems.add(
            key,
            f"uses {{topic}} ({json.dumps(template)}), but a job reading kafka.topic_pattern has "
            'one set of retry tiers for every topic: use {job} and {delay}, like "{job}.retry.'
            '{delay}"',
        )
        return ()
    tiers = tuple(
        RetryTier(i, delay, {m: _tier_topic(template, m, job_name, delay) for m in main_topics})
        for i, delay in enumerate(delays)
    )
    invalid = [name for tier in tiers for name in tier.topics.values() if not is_topic(name)]
    if invalid:
        t.problems.add(
            key,
            f"makes topic {json.dumps(invalid[0])} from {json.dumps(template)}, which is not "
            f"{TOPIC.noun}; change the pattern",
        )
    _check_distinct_topics(
        t.problems,
        main_topics,
        tiers,
        lambda index, main: f"{key} (for {json.dumps(main)} at retry.delays[{index}])",
        "the pattern must make its own topic for each main topic and delay: use {topic} and "
        "{delay} in it, and distinct delays",
    )
    return tiers


def _tier_topic(template: str, main_topic: str, job_name: str, delay_ms: int) -> str:
    return template.format(topic=main_topic, job=job_name, delay=format_duration(delay_ms))


def _check_distinct_topics(
    problems: Problems,
    main_topics: tuple[str, ...],
    tiers: tuple[RetryTier, ...],
    label: Callable[[int, str], str],
    hint: str,
) -> None:
    """Record a problem, under `label(tier index, main topic)`, for each tier topic that is a
    main topic or another tier's.
    """
    owners = {topic: f"kafka.topics[{i}]" for i, topic in enumerate(main_topics)}
    for tier in tiers:
        for main, topic in tier.topics.items():
            problems.claim(owners, label(tier.index, main), topic, hint)


def check_pattern_topics(
    problems: Problems, config_key: str, pattern: str, own: Mapping[str, str]
) -> None:
    """The main-topic pattern at `config_key` must match none of the job's `own` topics
    (topic -> what it is): the job would read its own retries or dead letters as new records.
    """
    matched = [(topic, what) for topic, what in own.items() if subscribed(topic, (), pattern)]
    if not matched:
        return
    topic, what = matched[0]
    more = f" (and {len(matched) - 1} more of its own topics)" if len(matched) > 1 else ""
    problems.add(
        config_key,
        f"matches {json.dumps(topic)}, the job's {what}{more}: the job would read it as a "
        "main topic; narrow the pattern, or rename that topic",
    )


def check_control_topics(problems: Problems, tables: Mapping[str, Table]) -> None:
    """The job's control topics (named after job.name) must be valid topic names, and no
    main, retry or dead-letter topic may be one of them.
    """
    name = tables["job"].values.get("name")
    if name is None:
        return
    internal = {
        produced_topic(name): "where it records which batches it produced",
        redriven_topic(name): "where it records which redrives it committed",
    }
    longest_topic = max(internal, key=len)
    if len(longest_topic) > _MAX_TOPIC_LENGTH:
        longest = _MAX_TOPIC_LENGTH - len(longest_topic) + len(name)
        problems.add(
            "job.name",
            f"makes the job's control topic {problems.show('job.name', longest_topic)}, "
            f"{len(longest_topic)} characters "
            f"long, and Kafka allows {_MAX_TOPIC_LENGTH}; use a name of at most {longest} "
            "characters",
        )
    topics = [
        (f"kafka.topics[{i}]", t) for i, t in enumerate(tables["kafka"].values["topics"] or ())
    ]
    for tier in tables["retry"].values.get("tiers") or ():
        topics += [
            (f"retry tier {tier.index} (retry.delays[{tier.index}])", t)
            for t in tier.topics.values()
        ]
    topics.append(("dead_letter.topic", tables["dead_letter"].values.get("topic")))
    for key, topic in topics:
        if topic in internal:
            problems.add(
                key,
                f"{problems.show(key, topic)} is the job's control topic ({internal[topic]}); "
                "choose another topic",
            )


def check_dead_letter_topics(
    problems: Problems,
    main_topics: tuple[str, ...],
    tiers: tuple[RetryTier, ...],
    key: str,
    topic: str,
    routes: tuple[tuple[str, str], ...],
) -> None:
    """Record a problem for the dead-letter topic (at `key`) or a route's topic that is a main
    or retry topic; routes may share a topic with each other and with the dead letter.
    """
    owners = {name: f"kafka.topics[{i}]" for i, name in enumerate(main_topics)}
    for tier in tiers:
        owners.update({name: f"retry tier {tier.index}" for name in tier.topics.values()})
    hint = "give the dead letter a topic of its own"
    for reference, route_topic in routes:
        problems.claim(dict(owners), f"dead_letter.routes.{reference}", route_topic, hint)
    problems.claim(owners, key, topic, hint)
