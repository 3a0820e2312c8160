"""Durations in config: parse_duration to whole milliseconds, format_duration back."""

from __future__ import annotations

import re

import pytest

from retrylib.config.durations import format_duration, parse_duration
from retrylib.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("500ms", 500),
        ("5s", 5_000),
        ("1.5m", 90_000),
        ("1h", 3_600_000),
        ("2d", 172_800_000),
        ("1m30s", 90_000),
        ("1h0m5s", 3_605_000),
        ("1d2h3m4s5ms", 93_784_005),
        ("0s", 0),
        ("5ms", 5),
        ("1.1s", 1_100),
        ("0.4ms", 0),
        ("1.6ms", 2),
    ],
)
def test_parse_duration_gives_whole_milliseconds(text: str, ms: int) -> None:
    parsed = parse_duration(text, "k")
    assert (parsed, type(parsed)) == (ms, int)


@pytest.mark.parametrize(
    "bad", ["5x", "", "5", "s", "5 s", " 5s", "1.m", "-1s", "30s1m", "1m1m", "5S", "1m 30s"]
)
def test_parse_duration_rejects_bad_text_naming_key_value_and_fix(bad: str) -> None:
    expected = f'retry.delays[1]: bad duration "{bad}": write a number and a unit, like "500ms"'
    with pytest.raises(ConfigError, match=re.escape(expected)):
        parse_duration(bad, "retry.delays[1]")


@pytest.mark.parametrize("bad", [5, 1.5, None, ["5s"]])
def test_parse_duration_rejects_non_strings(bad: object) -> None:
    with pytest.raises(ConfigError, match="^" + re.escape(f"job.trigger: bad duration {bad!r}")):
        parse_duration(bad, "job.trigger")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (5_000, "5s"),
        (60_000, "1m"),
        (90_000, "1m30s"),
        (500, "500ms"),
        (1_500, "1s500ms"),
        (3_600_000, "1h"),
        (86_461_000, "1d1m1s"),
        (0, "0s"),
        (1, "1ms"),
    ],
)
def test_format_duration(ms: int, text: str) -> None:
    assert format_duration(ms) == text


@pytest.mark.parametrize("ms", [1, 250, 5_000, 59_000, 61_000, 600_000, 3_599_500, 90_061_250])
def test_format_then_parse_round_trips(ms: int) -> None:
    assert parse_duration(format_duration(ms), "k") == ms


def test_format_duration_rejects_negative() -> None:
    with pytest.raises(ValueError, match="negative, got -1"):
        format_duration(-1)
