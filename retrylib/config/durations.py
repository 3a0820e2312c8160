"""Durations in config ("500ms", "5s", "1m30s") and their compact spelling in topic names."""

from __future__ import annotations

import json
import re

from retrylib.errors import ConfigError

_NUMBER = r"\d+(?:\.\d+)?"
# Units in a fixed order, each at most once: "1h30m" parses, "30m1h" and "1m1m" do not.
_DURATION = re.compile(
    "".join(f"(?:(?P<{unit}>{_NUMBER}){unit})?" for unit in ("d", "h", "m", "s", "ms"))
)
_UNIT_SECONDS = {"d": 86_400.0, "h": 3_600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
_UNIT_MILLIS = {unit: round(size * 1000) for unit, size in _UNIT_SECONDS.items()}


def parse_duration(text: str, key: str) -> float:
    """Return the seconds `text` spells: a number and a unit (ms, s, m, h, d), or several
    from largest to smallest unit ("1m30s").

    Raises `ConfigError` naming `key`, echoing `text` and showing the accepted form when `text`
    is not a string or does not follow that grammar. Zero ("0s") is accepted; callers that
    need a positive duration check that themselves.
    """
    match = _DURATION.fullmatch(text) if isinstance(text, str) else None
    if match is None or not any(match.groupdict().values()):
        shown = json.dumps(text) if isinstance(text, str) else repr(text)
        raise ConfigError(
            f'{key}: bad duration {shown}: write a number and a unit, like "500ms", "5s", "1m", '
            '"2h"'
        )
    return sum(
        float(amount) * _UNIT_SECONDS[unit]
        for unit, amount in match.groupdict().items()
        if amount is not None
    )


def format_duration(seconds: float) -> str:
    """Spell `seconds` compactly, largest unit first: 5 -> "5s", 90 -> "1m30s", 0.5 -> "500ms".

    The result is rounded to whole milliseconds and parses back with `parse_duration`.
    Raises `ValueError` for a negative duration.
    """
    if seconds < 0:
        raise ValueError(f"a duration cannot be negative, got {seconds!r}")
    remaining = round(seconds * 1000)
    if remaining == 0:
        return "0s"
    parts = []
    for unit, size in _UNIT_MILLIS.items():
        count, remaining = divmod(remaining, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)
