"""Durations in config ("500ms", "5s", "1m30s") as whole milliseconds, and their compact
spelling (in topic names, `retrylib status`, log lines).
"""

from __future__ import annotations

import json
import re

from retrylib.errors import ConfigError

_NUMBER = r"\d+(?:\.\d+)?"
# Units in a fixed order, each at most once: "1h30m" parses, "30m1h" and "1m1m" do not.
_DURATION = re.compile(
    "".join(f"(?:(?P<{unit}>{_NUMBER}){unit})?" for unit in ("d", "h", "m", "s", "ms"))
)
_UNIT_MS = {"d": 86_400_000, "h": 3_600_000, "m": 60_000, "s": 1_000, "ms": 1}


def parse_duration(text: str, key: str) -> int:
    """Return the milliseconds `text` spells, rounded to a whole one: a number and a unit
    (ms, s, m, h, d), or several from largest to smallest unit ("1m30s").

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
    return round(
        sum(
            float(amount) * _UNIT_MS[unit]
            for unit, amount in match.groupdict().items()
            if amount is not None
        )
    )


def format_duration(ms: int) -> str:
    """Spell `ms` milliseconds compactly, largest unit first: 5000 -> "5s", 90000 -> "1m30s",
    500 -> "500ms". The result parses back with `parse_duration`.

    Raises `ValueError` for a negative duration.
    """
    if ms < 0:
        raise ValueError(f"a duration cannot be negative, got {ms!r}")
    if ms == 0:
        return "0s"
    parts = []
    remaining = ms
    for unit, size in _UNIT_MS.items():
        count, remaining = divmod(remaining, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)
