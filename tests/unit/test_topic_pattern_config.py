"""`kafka.topic_pattern`: main topics by a regular expression, one set of retry tiers and a
dead-letter topic of the job's own, and what the config refuses."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import problem_for, write_literal_config

from retrylib.config.loader import load_config
from retrylib.config.topic_names import subscribed
from retrylib.job.handler_job import task_plan
from retrylib.job.source_frame import _every_topic, _held_to, source_options
from retrylib.source.options import parse_source_options

PATTERN = {"kafka.topics": None, "kafka.topic_pattern": "'orders-[a-z]+'"}


def test_a_pattern_job_has_tiers_and_a_dead_letter_topic_of_its_own(tmp_path: Path) -> None:
    config = load_config(write_literal_config(tmp_path, PATTERN))
    assert (config.kafka.topics, config.kafka.topic_pattern) == ((), "orders-[a-z]+")
    assert config.retry.tier_topics() == (
        "orders.retry.10s",
        "orders.retry.1m",
        "orders.retry.10m",
    )
    assert config.dead_letter.topic == "orders.dlt"
    kafka = config.kafka
    assert subscribed("orders-eu", kafka.topics, kafka.topic_pattern)
    assert not subscribed("orders.retry.10s", kafka.topics, kafka.topic_pattern)
    plan = task_plan(config, {}, b"k" * 32)
    assert plan.retry_topics == {"*": config.retry.tier_topics()}


def test_a_pattern_reaches_both_sources(tmp_path: Path) -> None:
    config = load_config(write_literal_config(tmp_path, PATTERN))
    main, _ = source_options(config)
    assert main["subscribePattern"] == "orders-[a-z]+"
    assert "subscribe" not in main
    every_topic = parse_source_options(_every_topic(config))
    assert every_topic.topic_pattern == "orders-[a-z]+"
    assert every_topic.topics == sorted(config.retry.tier_topics())


def test_an_available_now_run_holds_the_matched_topics_to_its_target(tmp_path: Path) -> None:
    """Spark 4.0/4.1: the source is told where the run ends for every topic it reads,
    named or matched, and for no other."""
    config = load_config(write_literal_config(tmp_path, PATTERN))
    tier = config.retry.tier_topics()[0]
    target = {("orders-eu", 0): 5, (tier, 1): 2, ("invoices", 0): 9}
    options = parse_source_options(_held_to(_every_topic(config), target))
    assert options.available_now_offsets == {("orders-eu", 0): 5, (tier, 1): 2}


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        (
            {"kafka.topic_pattern": "'orders.*'"},
            "kafka.topic_pattern: set together with kafka.topics; keep only one of them",
        ),
        (
            {**PATTERN, "kafka.topic_pattern": "'orders(['"},
            "kafka.topic_pattern: expected a regular expression a whole topic name must match",
        ),
        (
            {**PATTERN, "kafka.topic_pattern": "'orders.*'"},
            'kafka.topic_pattern: matches "orders.retry.10s", the job\'s retry tier topic (and '
            "3 more of its own topics): the job would read it as a main topic; narrow the "
            "pattern, or rename that topic",
        ),
        (
            {**PATTERN, "retry.topic_template": '"{topic}.retry.{delay}"'},
            "retry.topic_template: uses {topic}",
        ),
        (
            {**PATTERN, "kafka.starting_offsets": """'{"orders-eu": {"0": 5}}'"""},
            "kafka.starting_offsets: gives offsets per topic, but the job reads "
            "kafka.topic_pattern",
        ),
    ],
)
def test_pattern_problems_name_the_key_and_the_fix(tmp_path: Path, changes, problem) -> None:
    assert problem_for(tmp_path, changes).startswith(problem)
