"""The job config: a TOML file parsed once, at the edge, into frozen dataclasses.

`load_config` raises one `ConfigError` listing every problem (its `problems` attribute holds
them one by one); `collect_config_errors` returns the same list for `retrylib check`. Each
problem names the dotted key (`retry.delays[1]`), echoes the bad value and says the fix.
Any string may hold `${env:NAME}`, replaced by that environment variable; such values, and
Kafka options whose names look secret, never appear in messages or in `Config.redacted()`.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import string
import tomllib
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from retrylib.config.durations import format_duration, parse_duration
from retrylib.config.importing import import_object
from retrylib.config.schema import OutputSchema, parse_schema
from retrylib.delta.table_ref import TableRef
from retrylib.errors import ConfigError
from retrylib.kafka.clients import JOB_OWNED_OPTIONS, is_secret_key, option_problem
from retrylib.kafka.staging import control_topic

_DEFAULT_DELAYS = ("10s", "1m", "10m")
_DEFAULT_TOPIC_TEMPLATE = "{topic}.{job}.retry.{delay}"
_DEFAULT_DEAD_LETTER_TOPIC = "{topic}.{job}.dlt"
_MIN_DEFAULT_MAX_RETRY_AFTER = 3600.0
_ENV_REFERENCE = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)\}")
_REFERENCE_START = "${"
_MAX_TOPIC_LENGTH = 249
_OPTIONS_KEY = "kafka.options"
_REQUIRED_SECTIONS = ("job", "kafka", "handler", "output")
_LOCATIONS = (
    ("job", "checkpoint"),
    ("output", "table"),
    ("dead_letter", "table"),
    ("metrics", "table"),
)
_REQUIRED = object()


@dataclass(frozen=True)
class JobConfig:
    """[job]: the query name (also the Delta transaction app id), checkpoint and trigger."""

    name: str
    checkpoint: str
    trigger_seconds: float


class _ReadOnlyMappings:
    """Base of the config dataclasses that hold mappings: any Mapping given is stored as a
    read-only copy (MappingProxyType), and pickles as a plain dict, since pickle cannot
    handle a mappingproxy.
    """

    def __post_init__(self) -> None:
        for f in fields(self):  # type: ignore[arg-type]  # subclasses are dataclasses
            value = getattr(self, f.name)
            if isinstance(value, Mapping):
                object.__setattr__(self, f.name, MappingProxyType(dict(value)))

    def __reduce__(self) -> tuple[type, tuple[Any, ...]]:
        values = (getattr(self, f.name) for f in fields(self))  # type: ignore[arg-type]
        return type(self), tuple(dict(v) if isinstance(v, Mapping) else v for v in values)


@dataclass(frozen=True)
class KafkaConfig(_ReadOnlyMappings):
    """[kafka]: where to read the main topics, and options passed to every Kafka client."""

    bootstrap_servers: str
    topics: tuple[str, ...]
    starting_offsets: str
    max_offsets_per_trigger: int | None
    source: str
    create_topics: bool
    options: Mapping[str, str]


@dataclass(frozen=True)
class HandlerConfig:
    """[handler]: the user's function, the schema of what it returns, and where to import it."""

    function: str
    output_schema: OutputSchema
    paths: tuple[str, ...]
    timeout_seconds: float | None
    kind: str = "record"  # "record": one call per record; "arrow"/"pandas": one per batch


@dataclass(frozen=True)
class OutputConfig(_ReadOnlyMappings):
    """[output]: the Delta table the handler's results go to (a path/URI or a catalog name).

    `partition_by` and `properties` apply when the job creates the table; with
    `schema_evolution`, columns the output schema has and the table lacks are added.
    `optimize_every_ms`, when set, is how often the job compacts its tables (Delta's
    OPTIMIZE; see `compaction`).
    """

    table: str
    partition_by: tuple[str, ...] = ()
    properties: Mapping[str, str] = field(default_factory=dict)
    schema_evolution: bool = False
    optimize_every_ms: int | None = None

    def table_ref(self) -> TableRef:
        return TableRef.parse(self.table, "output.table")  # checked when the config loaded


@dataclass(frozen=True)
class RetryTier(_ReadOnlyMappings):
    """One delay tier: retry number `index + 1` waits `delay_seconds` in `topics[main_topic]`."""

    index: int
    delay_seconds: float
    topics: Mapping[str, str]


@dataclass(frozen=True)
class RetryConfig:
    """[retry]: delay tiers, how many handler calls a record gets, and what never retries."""

    delays_seconds: tuple[float, ...]
    max_attempts: int
    jitter: float
    non_retryable: tuple[str, ...]
    tiers: tuple[RetryTier, ...]
    max_retry_after_ms: int
    timeout_ms: int | None = None  # total retry time from the first failure; None: no limit

    def tier_topics(self) -> tuple[str, ...]:
        """Every retry topic, tier by tier, in the order of the main topics."""
        return tuple(topic for tier in self.tiers for topic in tier.topics.values())

    def tier_delays_ms(self) -> dict[str, int]:
        """The delay of every retry topic, in milliseconds."""
        return {
            topic: round(tier.delay_seconds * 1000)
            for tier in self.tiers
            for topic in tier.topics.values()
        }


@dataclass(frozen=True)
class DeadLetterConfig:
    """[dead_letter]: where records go when they are out of attempts or non-retryable.

    `routes` send a record whose last error is an instance of a class (by name, in order:
    the first match wins) to a topic of its own instead of `topic`.
    """

    topic: str
    table: str
    routes: tuple[tuple[str, str], ...] = ()

    def topics(self) -> tuple[str, ...]:
        """Every dead-letter topic: the default one, then each route's."""
        return tuple(dict.fromkeys([self.topic, *(topic for _, topic in self.routes)]))

    def table_ref(self) -> TableRef:
        return TableRef.parse(self.table, "dead_letter.table")  # checked when the config loaded


@dataclass(frozen=True)
class MetricsConfig:
    """[metrics]: an optional Delta table of per-batch counts."""

    table: str | None

    def table_ref(self) -> TableRef | None:
        """The table, checked when the config loaded; None when there is none."""
        return None if self.table is None else TableRef.parse(self.table, "metrics.table")


@dataclass(frozen=True)
class Config:
    """A whole, validated job config. `from_env` holds the dotted keys set from ${env:...}."""

    job: JobConfig
    kafka: KafkaConfig
    handler: HandlerConfig
    output: OutputConfig
    retry: RetryConfig
    dead_letter: DeadLetterConfig
    metrics: MetricsConfig
    source_path: str
    from_env: frozenset[str] = field(default=frozenset(), repr=False)

    def redacted(self) -> dict[str, Any]:
        """The config as plain nested dicts and lists, safe to print.

        Values of Kafka options whose names look secret (`is_secret_key`) and every value that
        came from ${env:...} are replaced by "***".
        """
        return {
            f.name: _plain(getattr(self, f.name), f.name, self.from_env)
            for f in fields(self)
            if f.name != "from_env"
        }

    def secret_options(self) -> tuple[str, ...]:
        """Names of the Kafka options whose values `redacted()` hides: what a process that
        only has the options (a Spark worker) must mask.
        """
        return tuple(
            name
            for name in self.kafka.options
            if _is_hidden(f"{_OPTIONS_KEY}.{name}", self.from_env)
        )


def load_config(
    path: str | Path,
    *,
    overrides: Mapping[str, object] | None = None,
    check_imports: bool = True,
) -> Config:
    """Read, validate and return the config at `path`.

    `overrides` maps dotted keys to values ({"kafka.bootstrap_servers": "127.0.0.1:5555"}) and
    is applied before validation. With `check_imports`, the handler and the non-retryable
    exception classes must import. Raises `ConfigError` listing every problem, one per line;
    its `problems` attribute holds them as a tuple.
    """
    config, problems = _parse(path, overrides or {}, check_imports)
    if config is None:
        count = f"{len(problems)} problem{'s' if len(problems) > 1 else ''}"
        error = ConfigError(f"invalid config {path} ({count}):\n" + "\n".join(problems))
        error.problems = tuple(problems)
        raise error
    return config


def collect_config_errors(
    path: str | Path,
    *,
    overrides: Mapping[str, object] | None = None,
    check_imports: bool = True,
) -> list[str]:
    """Every problem `load_config` would report for `path`, as a list (empty when valid)."""
    return _parse(path, overrides or {}, check_imports)[1]


@dataclass(frozen=True)
class _Kind:
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


def _one_of(*choices: str) -> _Kind:
    return _Kind("one of " + ", ".join(json.dumps(c) for c in choices), lambda v: v in choices)


def _is_topic(value: object) -> bool:
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


def _is_starting_offsets(value: object) -> bool:
    if value in ("earliest", "latest"):
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


_TEXT = _Kind("a non-empty string", _is_text)
_BOOL = _Kind("true or false", lambda v: isinstance(v, bool))
_POSITIVE_INT = _Kind("a whole number >= 1", lambda v: _is_int(v) and v >= 1)
_LIST = _Kind("a list", lambda v: isinstance(v, list | tuple))
_NON_EMPTY_LIST = _Kind("a non-empty list", lambda v: isinstance(v, list | tuple) and len(v) > 0)
_TABLE = _Kind("a table", lambda v: isinstance(v, dict))
_SCALAR = _Kind("a string, number or boolean", lambda v: isinstance(v, str | int | float))
_JOB_NAME = _Kind("a name of letters, digits, '.', '_' and '-'", _matches(r"[A-Za-z0-9_.-]+"))
_TOPIC = _Kind("a Kafka topic name (up to 249 letters, digits, '.', '_', '-')", _is_topic)
_FUNCTION_REF = _Kind('a reference like "package.module:function"', _matches(r"[\w.]+:[\w.]+"))
_EXCEPTION_REF = _Kind(
    'a builtin exception name or "package.module:Class"', _matches(r"[\w.]+(:[\w.]+)?")
)
_PERCENT = _Kind('a percentage from "0%" to "100%"', _is_percent)
_TOPIC_TEMPLATE = _Kind("a pattern using only {topic} and {delay}", _is_topic_template)
_SOURCE = _one_of("auto", "builtin", "python")
_HANDLER_KIND = _one_of("record", "arrow", "pandas")
_STARTING_OFFSETS = _Kind(
    '"earliest", "latest" or JSON like {"orders": {"0": 12}} (offset -2 earliest, -1 latest)',
    _is_starting_offsets,
)


class _Problems:
    """Collects problems instead of raising, so that every one is reported at once.

    Values are echoed in messages except `_is_hidden` ones (secret options, ${env:...} values).
    """

    def __init__(self) -> None:
        self.entries: list[tuple[str, bool]] = []  # (message, shown)
        self.from_env: set[str] = set()  # keys whose value came from ${env:...}
        self.unresolved: set[str] = set()  # keys naming an unset variable (already reported)

    @property
    def messages(self) -> list[str]:
        """The problems to report; those about a value left unresolved are noise, so skipped."""
        return [message for message, shown in self.entries if shown]

    def add(self, key: str, message: str) -> None:
        self.entries.append((f"{key}: {message}", key not in self.unresolved))

    def show(self, key: str, value: object) -> str:
        if _is_hidden(key, self.from_env):
            return '"***"'
        return json.dumps(value, default=str, ensure_ascii=False)

    def expect(self, key: str, value: object, kind: _Kind, example: str) -> bool:
        """Record a problem unless `value` is of `kind`; `example` shows a valid setting."""
        if kind.accepts(value):
            return True
        self.add(key, f"expected {kind.noun}, got {self.show(key, value)}; write it like {example}")
        return False

    def duration(self, key: str, value: object, *, positive: bool) -> float | None:
        """Seconds in the duration `value`, or None after recording why it is not one."""
        try:
            seconds = parse_duration(value, key)  # type: ignore[arg-type]  # checked there
        except ConfigError as e:
            self.add(key, str(e).removeprefix(f"{key}: "))
            return None
        if positive and seconds <= 0:
            self.add(
                key,
                f'expected a duration above zero, got {self.show(key, value)}; write it like "5s"',
            )
            return None
        return seconds

    def claim(self, owners: dict[str, str], key: str, name: str, hint: str) -> None:
        """Record `name` as used by `key` in `owners`, or a problem when another key has it."""
        if name in owners:
            self.add(key, f"{json.dumps(name)} is already used by {owners[name]}; {hint}")
        else:
            owners[name] = key


class _Table:
    """One TOML table being read. Getters return None for a bad or missing value (after
    recording the problem) and keep what they return in `values`, for checks across tables;
    `finish` then reports keys no getter asked for as unknown.
    """

    def __init__(
        self, problems: _Problems, name: str, data: Mapping[str, Any] | None = None
    ) -> None:
        """`data` None stands for a required table that is missing or not a table: that is
        reported already, so its keys are not reported missing one by one.
        """
        self.problems = problems
        self.name = name
        self.data = data if data is not None else {}
        self.broken = data is None
        self.known: list[str] = []
        self.values: dict[str, Any] = {}
        self.first_problem = len(problems.entries)

    @property
    def ok(self) -> bool:
        """True while nothing in this table (or checked on its behalf) has been a problem."""
        return not self.broken and len(self.problems.entries) == self.first_problem

    def path(self, key: str) -> str:
        return f"{self.name}.{key}" if self.name else key

    def table(self, key: str, example: str, *, required: bool) -> _Table:
        """The sub-table `key`: empty when optional and absent; broken when required and absent
        or when not a table (both reported).
        """
        data = self.get(key, _TABLE, example, _REQUIRED if required else {})
        return _Table(self.problems, self.path(key), data)

    def get(self, key: str, kind: _Kind, example: str, default: object = _REQUIRED) -> Any:
        """The value of `key` if it is of `kind`, else None; `default` when absent."""
        present, value = self._lookup(key, example, default)
        if present and not self.problems.expect(self.path(key), value, kind, example):
            value = None
        self.values[key] = value
        return value

    def strings(
        self,
        key: str,
        item: _Kind,
        example: str,
        default: object = _REQUIRED,
        *,
        empty_ok: bool = False,
    ) -> tuple[str, ...] | None:
        """The list at `key` as a tuple of distinct `item` values (non-empty unless `empty_ok`);
        None when absent without a default, or when it or any item is bad.
        """
        values = self.get(key, _LIST if empty_ok else _NON_EMPTY_LIST, example, default)
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
    ) -> float | None:
        """Seconds in the duration at `key` (or in `default`); None when absent or bad."""
        _, value = self._lookup(key, example, default)
        if value is not None:
            value = self.problems.duration(self.path(key), value, positive=positive)
        self.values[key] = value
        return value

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


def _parse(
    path: str | Path, overrides: Mapping[str, object], check_imports: bool
) -> tuple[Config | None, list[str]]:
    """The config (None when anything is wrong) and every problem found.

    Only a file that cannot be read as TOML stops the checks early.
    """
    problems = _Problems()
    data = _read_toml(path, problems)
    if data is None:
        return None, problems.messages
    _apply_overrides(data, overrides, problems)
    data = _interpolate(data, "", problems)
    config = _build(_Table(problems, "", data), check_imports, str(Path(path).resolve()))
    return (None if problems.entries else config), problems.messages


def _read_toml(path: str | Path, problems: _Problems) -> dict[str, Any] | None:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        problems.add(
            str(path), "no such file; pass the path of a TOML config like conf/orders.toml"
        )
    except OSError as e:
        problems.add(str(path), f"cannot read the config: {e.strerror}")
    except tomllib.TOMLDecodeError as e:
        problems.add(str(path), f"not valid TOML: {e}; fix the syntax there")
    return None


def _apply_overrides(
    data: dict[str, Any], overrides: Mapping[str, object], problems: _Problems
) -> None:
    """Set each dotted key in `data`, creating tables on the way.

    Below "kafka.options." the rest of the key is one option name ("sasl.mechanism").
    """
    for dotted, value in overrides.items():
        if dotted.startswith(_OPTIONS_KEY + "."):
            parts = [*_OPTIONS_KEY.split("."), dotted[len(_OPTIONS_KEY) + 1 :]]
        else:
            parts = dotted.split(".")
        node = data
        for depth, part in enumerate(parts[:-1]):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                where = ".".join(parts[: depth + 1])
                problems.add(f"overrides[{dotted!r}]", f"{where} is not a table; override {where}")
                break
        else:
            node[parts[-1]] = os.fspath(value) if isinstance(value, os.PathLike) else value


def _interpolate(node: Any, key: str, problems: _Problems) -> Any:
    """`node` with ${env:NAME} replaced in every string, noting each such key in
    `problems.from_env`. A reference to an unset variable, or a "${" that does not start a
    well-formed reference, is reported and the value left as written.
    """
    if isinstance(node, dict):
        return {k: _interpolate(v, f"{key}.{k}" if key else k, problems) for k, v in node.items()}
    if isinstance(node, list | tuple):
        return [_interpolate(v, f"{key}[{i}]", problems) for i, v in enumerate(node)]
    if not isinstance(node, str) or _REFERENCE_START not in node:
        return node
    problems.from_env.add(key)
    malformed = _malformed_references(node)
    for reference in malformed:
        problems.add(
            key,
            f"{reference} is not a reference to an environment variable; write ${{env:NAME}} "
            "with NAME made of letters, digits and '_', not starting with a digit (a value "
            'that must hold "${" itself can come whole from such a variable)',
        )
    unset = [name for name in _ENV_REFERENCE.findall(node) if name not in os.environ]
    if unset:
        names = " and ".join(unset)
        what = f"variable {names} is" if len(unset) == 1 else f"variables {names} are"
        problems.add(
            key,
            f"environment {what} not set (the value is {json.dumps(node)}); "
            f"export {names} before starting the job",
        )
    if malformed or unset:
        # Added after the reports above, so only later problems about this value are muted.
        problems.unresolved.add(key)
    return _ENV_REFERENCE.sub(lambda m: os.environ.get(m[1], m[0]), node)


def _malformed_references(text: str) -> list[str]:
    """Each "${...}" in `text` that is not a well-formed ${env:NAME}, as written; one with no
    closing "}" is shown as its start only, since the rest of the value may be a secret.
    """
    found = []
    start = text.find(_REFERENCE_START)
    while start >= 0:
        if not _ENV_REFERENCE.match(text, start):
            end = text.find("}", start)
            found.append(json.dumps(text[start : end + 1] if end >= 0 else _REFERENCE_START))
        start = text.find(_REFERENCE_START, start + len(_REFERENCE_START))
    return found


def _build(root: _Table, check_imports: bool, source_path: str) -> Config | None:
    """Read every section, then check what spans sections; None when anything is wrong."""
    tables = {
        name: root.table(name, f"a [{name}] table", required=name in _REQUIRED_SECTIONS)
        for name in (*_REQUIRED_SECTIONS, "retry", "dead_letter", "metrics")
    }
    root.finish()
    job = _job(tables["job"])
    kafka = _kafka(tables["kafka"])
    handler = _handler(tables["handler"], check_imports)
    output = _output(tables["output"], handler.output_schema if handler else None)
    main_topics = tables["kafka"].values["topics"]
    job_name = tables["job"].values.get("name")
    retry = _retry(tables["retry"], main_topics, job_name)
    dead_letter = _dead_letter(
        tables["dead_letter"],
        main_topics,
        job_name,
        tables["retry"].values["tiers"],
        tables["output"].values["table"],
    )
    metrics = _metrics(tables["metrics"])
    _check_control_topic(root.problems, tables)
    _check_locations(root.problems, tables)
    non_retryable = tables["retry"].values["non_retryable"]
    handler_paths = tables["handler"].values["paths"]
    if check_imports and non_retryable and handler_paths:
        _check_exception_classes(root.problems, "retry.non_retryable", non_retryable, handler_paths)
    if check_imports and dead_letter and dead_letter.routes and handler_paths:
        _check_exception_classes(
            root.problems,
            "dead_letter.routes",
            tuple(reference for reference, _ in dead_letter.routes),
            handler_paths,
        )
    if not (job and kafka and handler and output and retry and dead_letter and metrics):
        return None
    return Config(
        job,
        kafka,
        handler,
        output,
        retry,
        dead_letter,
        metrics,
        source_path,
        frozenset(root.problems.from_env),
    )


def _job(t: _Table) -> JobConfig | None:
    name = t.get("name", _JOB_NAME, 'name = "orders"')
    checkpoint = t.get("checkpoint", _TEXT, 'checkpoint = "/tmp/retrylib/orders/checkpoint"')
    trigger = t.duration("trigger", 'trigger = "1s"', "1s", positive=False)
    t.finish()
    return JobConfig(name, checkpoint, trigger) if t.ok else None


def _kafka(t: _Table) -> KafkaConfig | None:
    servers = t.get("bootstrap_servers", _TEXT, 'bootstrap_servers = "127.0.0.1:9092"')
    topics = t.strings("topics", _TOPIC, 'topics = ["orders"]')
    starting = t.get(
        "starting_offsets", _STARTING_OFFSETS, 'starting_offsets = "earliest"', "earliest"
    )
    max_offsets = t.get(
        "max_offsets_per_trigger", _POSITIVE_INT, "max_offsets_per_trigger = 100000", None
    )
    source = t.get("source", _SOURCE, 'source = "auto"', "auto")
    create_topics = t.get("create_topics", _BOOL, "create_topics = true", True)
    options = _kafka_options(
        t.table("options", '[kafka.options] "client.id" = "x"', required=False)
    )
    t.finish()
    if starting not in (None, "earliest", "latest") and topics:
        unknown = sorted(set(json.loads(starting)) - set(topics))
        if unknown:
            t.problems.add(
                t.path("starting_offsets"),
                f"names topics {json.dumps(unknown)} that are not in kafka.topics; "
                "give offsets only for the topics the job reads",
            )
    if not t.ok:
        return None
    return KafkaConfig(servers, topics, starting, max_offsets, source, create_topics, options)


def _options(t: _Table) -> dict[str, str]:
    """Kafka client options as strings; booleans become "true"/"false" as Kafka spells them."""
    example = '"sasl.mechanism" = "PLAIN" (quote names that hold dots)'
    for name in t.data:
        t.get(name, _SCALAR, example)
    return {
        name: str(value).lower() if isinstance(value, bool) else str(value)
        for name, value in t.data.items()
    }


def _kafka_options(t: _Table) -> dict[str, str]:
    """Kafka client options (`_options`), each checked the way librdkafka will take it, so
    that a bad one fails here rather than at the first client: not one the job sets itself
    (`JOB_OWNED_OPTIONS`), a property librdkafka knows, a value it accepts.
    """
    options = _options(t)
    for name, value in options.items():
        key = t.path(name)
        if key in t.problems.unresolved or not _SCALAR.accepts(t.data[name]):
            continue  # reported already
        if name in JOB_OWNED_OPTIONS:
            t.problems.add(key, f"set by the job itself: {JOB_OWNED_OPTIONS[name]}")
            continue
        reason = option_problem(name, value)
        if reason is None:
            continue
        if _is_hidden(key, t.problems.from_env) and value:
            reason = reason.replace(value, "***")
        if reason.startswith(("Invalid value", "Unsupported value")):
            fix = "give a value librdkafka accepts"
        elif name.startswith("kafka."):
            fix = f'drop the "kafka." prefix Spark uses: "{name.removeprefix("kafka.")}"'
        else:
            fix = (
                "the job's own Kafka clients are librdkafka's (Spark's connector gets the same "
                "options): use librdkafka's properties (for SASL: sasl.mechanism, "
                "sasl.username, sasl.password), or remove it"
            )
        t.problems.add(key, f"{reason.rstrip('.')}; {fix}")
    return options


def _handler(t: _Table, check_imports: bool) -> HandlerConfig | None:
    function = t.get("function", _FUNCTION_REF, 'function = "examples.handlers:enrich_order"')
    ddl = t.get("output_schema", _TEXT, 'output_schema = "order_id STRING, total DOUBLE"')
    paths = t.strings("paths", _TEXT, 'paths = ["."]', ["."])
    timeout = t.duration("timeout", 'timeout = "30s"', None, positive=True)
    kind = t.get("kind", _HANDLER_KIND, 'kind = "record"', "record")
    t.finish()
    schema = _schema(t.problems, t.path("output_schema"), ddl) if ddl else None
    if paths:
        paths = t.values["paths"] = tuple(os.path.abspath(p) for p in paths)
        if check_imports and function:
            _check_import(t.problems, t.path("function"), function, paths, callable, "callable")
    if not t.ok:
        return None
    return HandlerConfig(function, schema, paths, timeout, kind)


def _schema(problems: _Problems, key: str, ddl: str) -> OutputSchema | None:
    try:
        return parse_schema(ddl)
    except ValueError as e:
        problems.add(
            key,
            f"bad schema {json.dumps(ddl)}: {e}; write Spark DDL like "
            '"order_id STRING, total DOUBLE"',
        )
        return None


def _check_import(
    problems: _Problems,
    key: str,
    reference: str,
    paths: tuple[str, ...],
    test: Callable[[Any], bool],
    noun: str,
) -> None:
    """Record a problem unless `reference` imports (with `paths` on sys.path) and passes `test`."""
    try:
        target = import_object(reference, paths)
    except Exception as e:  # importing user code may raise anything; report it, don't crash
        problems.add(
            key,
            f"cannot import {json.dumps(reference)}: {type(e).__name__}: {e}; check the name and "
            f"that its module is under handler.paths {json.dumps(list(paths))}",
        )
        return
    if not test(target):
        problems.add(
            key, f"{json.dumps(reference)} is not {noun}, got {type(target).__name__}; name one"
        )


def _output(t: _Table, schema: OutputSchema | None) -> OutputConfig | None:
    table = t.get("table", _TEXT, 'table = "/tmp/retrylib/orders/out"')
    _check_table_name(t, "table", table)
    partition_by = t.strings(
        "partition_by", _TEXT, 'partition_by = ["order_date"]', [], empty_ok=True
    )
    properties = _options(
        t.table("properties", '[output.properties] "delta.appendOnly" = "true"', required=False)
    )
    evolve = t.get("schema_evolution", _BOOL, "schema_evolution = false", False)
    optimize_every = t.duration("optimize_every", 'optimize_every = "1h"', None, positive=True)
    t.finish()
    if schema is not None and partition_by:
        columns = {name.lower() for name in schema.names}
        for i, column in enumerate(partition_by):
            if column.lower() not in columns:
                t.problems.add(
                    f"{t.path('partition_by')}[{i}]",
                    f"{column!r} is not a column of handler.output_schema "
                    f"{list(schema.names)}; partition by one of them",
                )
    if not t.ok:
        return None
    return OutputConfig(
        table,
        tuple(partition_by or ()),
        properties,
        bool(evolve),
        None if optimize_every is None else round(optimize_every * 1000),
    )


def _check_table_name(t: _Table, key: str, table: str | None) -> None:
    """Report a Delta table setting that is neither a path/URI nor a catalog table name."""
    if table is None:
        return
    where = t.path(key)
    try:
        TableRef.parse(table, where)
    except ConfigError as e:
        t.problems.add(where, str(e).removeprefix(f"{where}: "))


def _retry(
    t: _Table, main_topics: tuple[str, ...] | None, job_name: str | None
) -> RetryConfig | None:
    texts = t.get("delays", _NON_EMPTY_LIST, 'delays = ["5s", "1m", "10m"]', [*_DEFAULT_DELAYS])
    delays = [
        t.problems.duration(f"{t.path('delays')}[{i}]", text, positive=True)
        for i, text in enumerate(texts or ())
    ]
    max_attempts = t.get("max_attempts", _POSITIVE_INT, "max_attempts = 4", 4)
    jitter = t.get("jitter", _PERCENT, 'jitter = "10%"', "0%")
    non_retryable = t.strings(
        "non_retryable", _EXCEPTION_REF, 'non_retryable = ["ValueError"]', [], empty_ok=True
    )
    explicit = t.strings("topics", _TOPIC, 'topics = ["orders.retry.5s", "orders.retry.1m"]', None)
    template_example = f"topic_template = {json.dumps(_DEFAULT_TOPIC_TEMPLATE)}"
    template = t.get("topic_template", _TOPIC_TEMPLATE, template_example, _DEFAULT_TOPIC_TEMPLATE)
    max_retry_after = t.duration("max_retry_after", 'max_retry_after = "6h"', None, positive=True)
    timeout = t.duration("timeout", 'timeout = "1h"', None, positive=True)
    t.finish()
    tiers = None
    if main_topics is not None and job_name and texts is not None and None not in delays:
        if explicit is not None:
            tiers = _explicit_tiers(t, delays, main_topics, explicit)
        elif template is not None and "topics" not in t.data:
            tiers = _template_tiers(t, delays, main_topics, job_name, template)
    t.values["tiers"] = tiers
    if not t.ok or tiers is None:
        return None
    if max_retry_after is None:
        max_retry_after = max(_MIN_DEFAULT_MAX_RETRY_AFTER, *delays)
    return RetryConfig(
        tuple(delays),
        max_attempts,
        float(jitter[:-1]) / 100,
        non_retryable,
        tiers,
        round(max_retry_after * 1000),
        None if timeout is None else round(timeout * 1000),
    )


def _explicit_tiers(
    t: _Table, delays: list[float], main_topics: tuple[str, ...], topics: tuple[str, ...]
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


def _template_tiers(
    t: _Table, delays: list[float], main_topics: tuple[str, ...], job_name: str, template: str
) -> tuple[RetryTier, ...]:
    """Tiers named by retry.topic_template for every main topic and delay."""
    key = t.path("topic_template")
    tiers = tuple(
        RetryTier(i, delay, {m: _tier_topic(template, m, job_name, delay) for m in main_topics})
        for i, delay in enumerate(delays)
    )
    invalid = [name for tier in tiers for name in tier.topics.values() if not _is_topic(name)]
    if invalid:
        t.problems.add(
            key,
            f"makes topic {json.dumps(invalid[0])} from {json.dumps(template)}, which is not "
            f"{_TOPIC.noun}; change the pattern",
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


def _tier_topic(template: str, main_topic: str, job_name: str, delay: float) -> str:
    return template.format(topic=main_topic, job=job_name, delay=format_duration(delay))


def _check_distinct_topics(
    problems: _Problems,
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


def _dead_letter(
    t: _Table,
    main_topics: tuple[str, ...] | None,
    job_name: str | None,
    tiers: tuple[RetryTier, ...] | None,
    output_table: str | None,
) -> DeadLetterConfig | None:
    """The dead-letter topic (default "<first main topic>.<job>.dlt") and table (default
    "<output.table>_dead_letter"), the topic distinct from every main and retry topic.
    """
    default_topic = None
    if main_topics and job_name:
        default_topic = _DEFAULT_DEAD_LETTER_TOPIC.format(topic=main_topics[0], job=job_name)
    topic = t.get("topic", _TOPIC, 'topic = "orders.dlt"', default_topic)
    default_table = f"{output_table.rstrip('/')}_dead_letter" if output_table else None
    table = t.get("table", _TEXT, 'table = "/tmp/retrylib/orders/dead_letter"', default_table)
    t.values["table"] = table  # the default too, for _check_locations
    if "table" in t.data:  # a default made from a bad output.table is reported there
        _check_table_name(t, "table", table)
    routes_example = '[dead_letter.routes] "ValueError" = "orders.invalid.dlt"'
    routes = _dead_letter_routes(t.table("routes", routes_example, required=False))
    t.finish()
    if topic and main_topics:
        owners = {name: f"kafka.topics[{i}]" for i, name in enumerate(main_topics)}
        for tier in tiers or ():
            owners.update({name: f"retry tier {tier.index}" for name in tier.topics.values()})
        hint = "give the dead letter a topic of its own"
        for reference, route_topic in routes:  # routes may share a topic with each other
            key = f"dead_letter.routes.{reference}"
            t.problems.claim(dict(owners), key, route_topic, hint)
        t.problems.claim(owners, t.path("topic"), topic, hint)
    if not t.ok or topic is None or table is None:
        return None
    return DeadLetterConfig(topic, table, routes)


def _dead_letter_routes(t: _Table) -> tuple[tuple[str, str], ...]:
    """[dead_letter.routes]: exception class name -> dead-letter topic, in the file's order.

    Several classes may share a topic; `_check_dead_letter_routes` checks the names import.
    """
    routes = []
    for reference in t.data:
        if not _EXCEPTION_REF.accepts(reference):
            t.problems.add(
                t.path(reference),
                f"expected {_EXCEPTION_REF.noun} as the name, got {json.dumps(reference)}; "
                'write it like "ValueError" = "orders.invalid.dlt"',
            )
            continue
        topic = t.get(reference, _TOPIC, '"ValueError" = "orders.invalid.dlt"')
        if topic is not None:
            routes.append((reference, topic))
    return tuple(routes)


def _metrics(t: _Table) -> MetricsConfig | None:
    table = t.get("table", _TEXT, 'table = "/tmp/retrylib/orders/metrics"', None)
    _check_table_name(t, "table", table)
    t.finish()
    return MetricsConfig(table) if t.ok else None


def _check_control_topic(problems: _Problems, tables: Mapping[str, _Table]) -> None:
    """The job's control topic (`control_topic`, named after job.name) must be a valid topic
    name, and no main, retry or dead-letter topic may be that topic.
    """
    name = tables["job"].values.get("name")
    if name is None:
        return
    internal = control_topic(name)
    if len(internal) > _MAX_TOPIC_LENGTH:
        longest = _MAX_TOPIC_LENGTH - len(internal) + len(name)
        problems.add(
            "job.name",
            f"makes the job's control topic {problems.show('job.name', internal)}, "
            f"{len(internal)} characters "
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
        if topic == internal:
            problems.add(
                key,
                f"{problems.show(key, topic)} is the job's control topic (where it records which "
                "batches it produced); choose another topic",
            )


def _check_locations(problems: _Problems, tables: Mapping[str, _Table]) -> None:
    """The checkpoint and each Delta table need a location of their own, none inside
    another (a table inside the checkpoint, a table inside a table's folder).
    """
    owners: dict[str, str] = {}
    paths: list[tuple[str, str]] = []  # (key, location id) of each path, not catalog names
    for section, key in _LOCATIONS:
        location = tables[section].values.get(key)
        if location is None:
            continue
        dotted = f"{section}.{key}"
        where = _location_id(location)
        problems.claim(owners, dotted, where, "the checkpoint and each table need their own")
        if section == "job" or _is_path(location):
            paths.append((dotted, where))
    for key, where in paths:
        for outer_key, outer in paths:
            if where.startswith(outer.rstrip("/") + "/"):
                problems.add(
                    key,
                    f"{json.dumps(where)} is inside {outer_key} {json.dumps(outer)}; give each "
                    "table and the checkpoint a location of its own, none inside another",
                )


def _location_id(location: str) -> str:
    """`location` in a form where equal places compare equal (absolute for local paths)."""
    if "://" in location:
        return location.rstrip("/")
    return os.path.normpath(os.path.abspath(location))


def _is_path(table: str) -> bool:
    """True when the table setting `table` names a path or URI (not a catalog table)."""
    try:
        return TableRef.parse(table, "table").is_path
    except ConfigError:
        return False  # reported where the setting was read


def _check_exception_classes(
    problems: _Problems, key: str, references: tuple[str, ...], paths: tuple[str, ...]
) -> None:
    """Each of `references` (the list or table at `key`) must import, with the handler's
    paths, as an exception class."""

    def is_exception_class(target: object) -> bool:
        return isinstance(target, type) and issubclass(target, BaseException)

    for i, reference in enumerate(references):
        where = f"{key}[{i}]" if key == "retry.non_retryable" else f"{key}.{reference}"
        _check_import(problems, where, reference, paths, is_exception_class, "an exception class")


def _is_hidden(key: str, from_env: Collection[str]) -> bool:
    """True for values never to show: set from ${env:...}, or a Kafka option that looks secret."""
    option = key.removeprefix(_OPTIONS_KEY + ".")
    return key in from_env or (option != key and is_secret_key(option))


def _plain(value: Any, key: str, from_env: Collection[str]) -> Any:
    """`value` as plain dicts, lists and scalars, with hidden values (`_is_hidden`) as "***"."""
    if isinstance(value, OutputSchema):
        return value.ddl
    if is_dataclass(value):
        return {
            f.name: _plain(getattr(value, f.name), f"{key}.{f.name}", from_env)
            for f in fields(value)
        }
    if isinstance(value, Mapping):
        return {k: _plain(v, f"{key}.{k}", from_env) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [_plain(v, f"{key}[{i}]", from_env) for i, v in enumerate(value)]
    return "***" if _is_hidden(key, from_env) else value
