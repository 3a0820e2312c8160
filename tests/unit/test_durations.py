"""Durations in config: parse_duration and format_duration."""

from __future__ import annotations

import re

import pytest

from retrylib.config.durations import format_duration, parse_duration
from retrylib.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("500ms", 0.5),
        ("5s", 5.0),
        ("1.5m", 90.0),
        ("1h", 3600.0),
        ("2d", 172_800.0),
        ("1m30s", 90.0),
        ("1h0m5s", 3605.0),
        ("1d2h3m4s5ms", 93_784.005),
        ("0s", 0.0),
        ("5ms", 0.005),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text, "k") == pytest.approx(seconds)


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
    ("seconds", "text"),
    [
        (5, "5s"),
        (60, "1m"),
        (90, "1m30s"),
        (0.5, "500ms"),
        (1.5, "1s500ms"),
        (3600, "1h"),
        (86_400 + 61, "1d1m1s"),
        (0, "0s"),
        (0.0004, "0s"),
    ],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize("seconds", [0.001, 0.25, 5, 59, 61, 600, 3599.5, 90_061.25])
def test_format_then_parse_round_trips(seconds: float) -> None:
    assert parse_duration(format_duration(seconds), "k") == pytest.approx(seconds)


def test_format_duration_rejects_negative() -> None:
    with pytest.raises(ValueError, match="negative, got -1"):
        format_duration(-1)
