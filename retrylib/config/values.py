"""Checking config values one by one: what each must be (a `Kind`), and `Table`, the reader
of one TOML table that checks every value it returns and reports unknown and missing keys.

Problems are collected (`Problems`), not raised, so that all of them are reported at once.
"""

from __future__ import annotations

import difflib
import json
import re
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from retrylib.config.durations import parse_duration
from retrylib.config.secrets import MASK, is_hidden
from retrylib.errors import ConfigError

_REQUIRED = object()


@dataclass(frozen=True)
class Kind:
    """What a value must be: a phrase for messages and a test."""

    noun: str
    accepts: Callable[[Any], bool]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_text(value: object) -> bool:
    return isinstance(value, str) and value.strip() != ""


def _matches(pattern: str) -> Callable[[Any], bool]:
    compiled = re.compile(pattern)
    return lambda value: isinstance(value, str) and compiled.fullmatch(value) is not None


def _one_of(*choices: str) -> Kind:
    return Kind("one of " + ", ".join(json.dumps(c) for c in choices), lambda v: v in choices)


def is_topic(value: object) -> bool:
    return _matches(r"[A-Za-z0-9._-]{1,249}")(value) and value not in (".", "..")


def _is_percent(value: object) -> bool:
    return _matches(r"\d+(\.\d+)?%")(value) and float(value[:-1]) <= 100


def _is_topic_template(value: object) -> bool:
    if not isinstance(value, str):
        return False
    try:
        parts = list(string.Formatter().parse(value))
    except ValueError:
        return False
    return all(
        name is None or (name in ("topic", "job", "delay") and not spec and conversion is None)
        for _, name, spec, conversion in parts
    )


def instant_ms(value: object) -> int | None:
    """Epoch milliseconds of a date-time with a zone: a TOML date-time, or RFC 3339 text
    such as "2026-11-01T08:00:00Z"; None for anything else."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return None
    if not isinstance(value, datetime) or value.tzinfo is None:
        return None
    return round(value.timestamp() * 1000)


def _is_pattern(value: object) -> bool:
    if not _is_text(value):
        return False
    try:
        re.compile(value)
    except re.error:
        return False
    return True


def _is_starting_offsets(value: object) -> bool:
    if value in ("earliest", "latest") or instant_ms(value) is not None:
        return True
    try:
        offsets = json.loads(value) if isinstance(value, str) else None
    except ValueError:
        return False
    return (
        isinstance(offsets, dict)
        and bool(offsets)
        and all(
            isinstance(partitions, dict)
            and bool(partitions)
            and all(p.isdigit() and _is_int(o) and o >= -2 for p, o in partitions.items())
            for partitions in offsets.values()
        )
    )


TEXT = Kind("a non-empty string", _is_text)
BOOL = Kind("true or false", lambda v: isinstance(v, bool))
POSITIVE_INT = Kind("a whole number >= 1", lambda v: _is_int(v) and v >= 1)
_LIST = Kind("a list", lambda v: isinstance(v, list | tuple))
NON_EMPTY_LIST = Kind("a non-empty list", lambda v: isinstance(v, list | tuple) and len(v) > 0)
_TABLE = Kind("a table", lambda v: isinstance(v, dict))
SCALAR = Kind("a string, number or boolean", lambda v: isinstance(v, str | int | float))
JOB_NAME = Kind("a name of letters, digits, '.', '_' and '-'", _matches(r"[A-Za-z0-9_.-]+"))
TOPIC = Kind("a Kafka topic name (up to 249 letters, digits, '.', '_', '-')", is_topic)
FUNCTION_REF = Kind('a reference like "package.module:function"', _matches(r"[\w.]+:[\w.]+"))
EXCEPTION_REF = Kind(
    'a builtin exception name or "package.module:Class"', _matches(r"[\w.]+(:[\w.]+)?")
)
PERCENT = Kind('a percentage from "0%" to "100%"', _is_percent)
TOPIC_PATTERN = Kind("a regular expression a whole topic name must match", _is_pattern)
TOPIC_TEMPLATE = Kind("a pattern using only {topic} and {delay}", _is_topic_template)
SOURCE = _one_of("auto", "builtin", "python")
HANDLER_KIND = _one_of("record", "arrow", "pandas")
SECURITY_PROTOCOL = _one_of("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISM = _one_of("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
STARTING_OFFSETS = Kind(
    '"earliest", "latest", a date-time with a zone like "2026-11-01T08:00:00Z", or JSON like '
    '{"orders": {"0": 12}} (offset -2 earliest, -1 latest)',
    _is_starting_offsets,
)


class Problems:
    """Collects problems instead of raising, so that every one is reported at once.

    Values are echoed in messages except `is_hidden` ones (secret options, ${env:...} values).
    """

    def __init__(self) -> None:
        self.entries: list[tuple[str, bool]] = []  # (message, shown)
        self.from_env: set[str] = set()  # keys whose value came from ${env:...}
        self.env_variables: set[str] = set()  # the NAMEs of those ${env:NAME}
        self.unresolved: set[str] = set()  # keys naming an unset variable (already reported)
        # Unset variables taken as set where the job runs (`loader.check_elsewhere`), or None.
        self.unset_elsewhere: set[str] | None = None

    @property
    def messages(self) -> list[str]:
        """The problems to report; those about a value left unresolved are noise, so skipped."""
        return [message for message, shown in self.entries if shown]

    def add(self, key: str, message: str) -> None:
        self.entries.append((f"{key}: {message}", key not in self.unresolved))

    def show(self, key: str, value: object) -> str:
        if is_hidden(key, self.from_env):
            return json.dumps(MASK)
        return json.dumps(value, default=str, ensure_ascii=False)

    def expect(self, key: str, value: object, kind: Kind, example: str) -> bool:
        """Record a problem unless `value` is of `kind`; `example` shows a valid setting."""
        if kind.accepts(value):
            return True
        self.add(key, f"expected {kind.noun}, got {self.show(key, value)}; write it like {example}")
        return False

    def duration(self, key: str, value: object, *, positive: bool) -> int | None:
        """Milliseconds in the duration `value`, or None after recording why it is not one."""
        try:
            ms = parse_duration(value, key)  # type: ignore[arg-type]  # checked there
        except ConfigError as e:
            self.add(key, str(e).removeprefix(f"{key}: "))
            return None
        if positive and ms <= 0:
            self.add(
                key,
                f'expected a duration above zero, got {self.show(key, value)}; write it like "5s"',
            )
            return None
        return ms

    def claim(self, owners: dict[str, str], key: str, name: str, hint: str) -> None:
        """Record `name` as used by `key` in `owners`, or a problem when another key has it."""
        if name in owners:
            self.add(key, f"{json.dumps(name)} is already used by {owners[name]}; {hint}")
        else:
            owners[name] = key


class Table:
    """One TOML table being read. Getters return None for a bad or missing value (after
    recording the problem) and keep what they return in `values`, for checks across tables;
    `finish` then reports keys no getter asked for as unknown.
    """

    def __init__(
        self, problems: Problems, name: str, data: Mapping[str, Any] | None = None
    ) -> None:
        """`data` None stands for a required table that is missing or not a table: that is
        reported already, so its keys are not reported missing one by one.
        """
        self.problems = problems
        self.name = name
        self.data = data if data is not None else {}
        self.broken = data is None
        self.known: list[str] = []
        self.tables: dict[str, Table] = {}  # the sub-tables read through `table`, by key
        self.values: dict[str, Any] = {}
        self.first_problem = len(problems.entries)

    @property
    def ok(self) -> bool:
        """True while nothing in this table (or checked on its behalf) has been a problem."""
        return not self.broken and len(self.problems.entries) == self.first_problem

    def path(self, key: str) -> str:
        return f"{self.name}.{key}" if self.name else key

    def table(self, key: str, example: str, *, required: bool) -> Table:
        """The sub-table `key`: empty when optional and absent; broken when required and absent
        or when not a table (both reported).
        """
        data = self.get(key, _TABLE, example, _REQUIRED if required else {})
        self.tables[key] = Table(self.problems, self.path(key), data)
        return self.tables[key]

    def get(self, key: str, kind: Kind, example: str, default: object = _REQUIRED) -> Any:
        """The value of `key` if it is of `kind`, else None; `default` when absent."""
        present, value = self._lookup(key, example, default)
        if present and not self.problems.expect(self.path(key), value, kind, example):
            value = None
        self.values[key] = value
        return value

    def strings(
        self,
        key: str,
        item: Kind,
        example: str,
        default: object = _REQUIRED,
        *,
        empty_ok: bool = False,
    ) -> tuple[str, ...] | None:
        """The list at `key` as a tuple of distinct `item` values (non-empty unless `empty_ok`);
        None when absent without a default, or when it or any item is bad.
        """
        values = self.get(key, _LIST if empty_ok else NON_EMPTY_LIST, example, default)
        if values is None:
            return None
        path = self.path(key)
        good = [
            self.problems.expect(f"{path}[{i}]", v, item, example) for i, v in enumerate(values)
        ]
        for i, value in enumerate(values):
            if value in values[:i]:
                shown = self.problems.show(f"{path}[{i}]", value)
                self.problems.add(f"{path}[{i}]", f"{shown} is listed twice; list it once")
        self.values[key] = tuple(values) if all(good) else None
        return self.values[key]

    def duration(
        self, key: str, example: str, default: str | None, *, positive: bool
    ) -> int | None:
        """Milliseconds in the duration at `key` (or in `default`); None when absent or bad."""
        _, value = self._lookup(key, example, default)
        if value is not None:
            value = self.problems.duration(self.path(key), value, positive=positive)
        self.values[key] = value
        return value

    def refuse(self, key: str, message: str) -> None:
        """Report `key`, present but not wanted here, with `message` saying why and the fix."""
        self.known.append(key)
        self.problems.add(self.path(key), message)

    def finish(self) -> None:
        """Report every key of the table that no getter asked for."""
        for key in self.data:
            if key not in self.known:
                self.problems.add(self.path(key), f"unknown key; {_suggest(key, self.known)}")

    def _lookup(self, key: str, example: str, default: object) -> tuple[bool, Any]:
        self.known.append(key)
        if key in self.data:
            return True, self.data[key]
        if default is not _REQUIRED:
            return False, default
        if not self.broken:
            where = f"under [{self.name}]" if self.name else "to the file"
            self.problems.add(self.path(key), f"missing; add {example} {where}")
        return False, None


def _suggest(key: str, valid: list[str]) -> str:
    # A shared start beats difflib's similarity: "retries" should suggest "retry", not "metrics".
    close = [k for k in valid if k[:3] == key[:3]] or difflib.get_close_matches(key, valid, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"{hint}valid keys here are {', '.join(sorted(valid))}"
