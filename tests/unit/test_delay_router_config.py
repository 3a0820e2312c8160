"""A delay router's config ([delay_router]): what it holds, how the job reads it, and what the
config refuses, each refusal naming its key and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from retrylib.config.loader import collect_config_errors, load_config
from retrylib.config.model import DelayRouterJobConfig
from retrylib.job.router_job import forward_plan
from retrylib.job.source_frame import _every_topic
from retrylib.source.options import parse_source_options

FALLBACK = "delay_router.fallback_topic"
ROUTER = """
[job]
name = "krr"
checkpoint = "{tmp}/checkpoint"

[kafka]
bootstrap_servers = "127.0.0.1:9092"
{kafka}
[delay_router]
topics = {{ "retry_topic_5sec" = "5s", "retry_topic_15min" = "15m" }}
{router}
{extra}
"""


def write_router(tmp_path: Path, *, kafka: str = "", router: str = "", extra: str = "") -> Path:
    path = tmp_path / "router.toml"
    path.write_text(ROUTER.format(tmp=tmp_path, kafka=kafka, router=router, extra=extra))
    return path


def test_a_router_has_delay_topics_and_krr_header_names_by_default(tmp_path: Path) -> None:
    config = load_config(write_router(tmp_path))
    assert isinstance(config, DelayRouterJobConfig)  # no handler, output, retry or dead letter
    router = config.delay_router
    assert dict(router.topics) == {"retry_topic_5sec": 5_000, "retry_topic_15min": 900_000}
    assert (router.target_header, router.timestamp_header) == ("final_topic", "msg_ts")
    assert router.fallback_topic is None
    assert config.delayed_topics() == dict(router.topics)


def test_a_router_reads_its_delay_topics_from_earliest_up_to_what_is_due(tmp_path: Path) -> None:
    config = load_config(write_router(tmp_path, router='fallback_topic = "retry_fallback"'))
    options = parse_source_options(_every_topic(config))
    assert sorted(options.topics) == ["retry_topic_15min", "retry_topic_5sec"]
    assert options.delays_ms == {"retry_topic_5sec": 5_000, "retry_topic_15min": 900_000}
    assert options.read_ahead_ms == 2_000  # its tasks wait for what they read ahead
    assert isinstance(config, DelayRouterJobConfig)
    plan = forward_plan(config)
    assert (plan.fallback_topic, plan.output_schema, plan.isolated()) == (
        "retry_fallback",
        None,
        None,
    )
    assert plan.read_ahead_ms == 2_000
    assert plan.max_timestamp_ahead_ms == 3_600_000


def test_header_names_and_fallback_are_configurable(tmp_path: Path) -> None:
    router = (
        'target_header = "x-target"\ntimestamp_header = "x-sent"\nfallback_topic = "fb"\n'
        'max_timestamp_ahead = "1d"'
    )
    config = load_config(write_router(tmp_path, router=router))
    assert isinstance(config, DelayRouterJobConfig)
    assert config.delay_router.target_header == "x-target"
    assert config.delay_router.timestamp_header == "x-sent"
    assert config.delay_router.fallback_topic == "fb"
    assert config.delay_router.max_timestamp_ahead_ms == 86_400_000


@pytest.mark.parametrize(
    ("kafka", "router", "extra", "key", "says"),
    [
        ('topics = ["orders"]', "", "", "kafka.topics", "remove kafka.topics"),
        ('topic_pattern = "o.*"', "", "", "kafka.topic_pattern", "remove kafka.topic_pattern"),
        ('source = "builtin"', "", "", "kafka.source", "retrylib's own source"),
        ('starting_offsets = "latest"', "", "", "kafka.starting_offsets", "earliest record"),
        ("", "", '[handler]\nfunction = "h:f"', "handler", "calls no handler; remove [handler]"),
        ("", "", '[retry]\ndelays = ["1s"]', "retry", "remove [retry]"),
        ("", "", '[dead_letter]\ntopic = "d"', "dead_letter", "remove [dead_letter]"),
        ("", 'fallback_topic = "retry_topic_5sec"', "", FALLBACK, "for ever"),
        (
            "",
            'fallback_topic = "_retrylib.krr.produced"',
            "",
            FALLBACK,
            "contr",
        ),
        ("", 'timestamp_header = "final_topic"', "", "delay_router.timestamp_header", "same"),
        ("", 'fallback_topic = "no way"', "", FALLBACK, "topic name"),
        ("", 'max_timestamp_ahead = "0s"', "", "delay_router.max_timestamp_ahead", "above zero"),
        ("", 'final_topic = "x"', "", "delay_router.final_topic", "did you mean"),
    ],
)
def test_refusals_name_the_key_and_the_fix(
    tmp_path: Path, kafka: str, router: str, extra: str, key: str, says: str
) -> None:
    problems = collect_config_errors(
        write_router(tmp_path, kafka=kafka, router=router, extra=extra)
    )
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"{key}: "), problems
    assert says in problems[0]


def test_delay_topics_must_be_topic_names_with_durations(tmp_path: Path) -> None:
    path = tmp_path / "router.toml"
    text = ROUTER.format(tmp=tmp_path, kafka="", router="", extra="")
    path.write_text(
        text.replace('"retry_topic_15min" = "15m"', '"bad topic" = "15m", "t" = "soon"')
    )
    problems = collect_config_errors(path)
    assert any(p.startswith("delay_router.topics.bad topic: ") for p in problems), problems
    assert any(p.startswith("delay_router.topics.t: ") and "soon" in p for p in problems), problems
    path.write_text(
        text.replace(
            'topics = { "retry_topic_5sec" = "5s", "retry_topic_15min" = "15m" }', "topics = {}"
        )
    )
    assert collect_config_errors(path) == [
        "delay_router.topics: names no delay topic; add one, as [delay_router.topics] "
        '"retry_topic_5min" = "5m"'
    ]


def test_the_shipped_router_config_is_valid() -> None:
    config = load_config(Path(__file__).parents[2] / "conf" / "retry_router.toml")
    assert isinstance(config, DelayRouterJobConfig)
    assert config.delay_router.fallback_topic == "retry_fallback"
