"""Loading the job config: a TOML file read once, at the edge, into the `model` dataclasses.

`load_config` raises one `ConfigError` listing every problem (its `problems` attribute holds
them one by one); `collect_config_errors` returns the same list for `retrylib check`. Each
problem names the dotted key (`retry.delays[1]`), echoes the bad value and says the fix.
Any string may hold `${env:NAME}`, replaced by that environment variable; such values, and
Kafka options whose names look secret, never appear in messages or in `Config.redacted()`.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from retrylib.config.delay_sections import check_key_order, read_delay_router, read_retry
from retrylib.config.import_checks import check_callable, check_exception_classes
from retrylib.config.locations import check_locations
from retrylib.config.model import AnyConfig, Config, DelayRouterJobConfig
from retrylib.config.placeholders import placeholders
from retrylib.config.secrets import OPTION_TABLES
from retrylib.config.sections import (
    read_breaker,
    read_dead_letter,
    read_handler,
    read_hooks,
    read_job,
    read_kafka,
    read_metrics,
    read_output,
)
from retrylib.config.topic_names import produced_topic, redriven_topic
from retrylib.config.topics import check_control_topics, check_pattern_topics
from retrylib.config.values import Problems, Table
from retrylib.errors import ConfigError

_ENV_REFERENCE = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)\}")
_REFERENCE_START = "${"
_REQUIRED_SECTIONS = ("job", "kafka", "handler", "output")
_OPTIONAL_SECTIONS = ("retry", "dead_letter", "metrics", "hooks", "breaker")


def load_config(
    path: str | Path,
    *,
    overrides: Mapping[str, object] | None = None,
    check_imports: bool = True,
) -> AnyConfig:
    """Read, validate and return the config at `path`.

    `overrides` maps dotted keys to values ({"kafka.bootstrap_servers": "127.0.0.1:5555"}) and
    is applied before validation. With `check_imports`, the handler and the non-retryable
    exception classes must import. Raises `ConfigError` listing every problem, one per line;
    its `problems` attribute holds them as a tuple.
    """
    config, found = _parse(path, overrides or {}, check_imports)
    if config is None:
        problems = found.messages
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
    return _parse(path, overrides or {}, check_imports)[1].messages


def check_elsewhere(path: str | Path) -> tuple[list[str], list[str]]:
    """The problems of the config at `path` checked away from where its job runs (a laptop,
    CI): a checkpoint or table named by a local path is not looked at, and an unset
    ${env:NAME} is taken as set there (the value it is part of goes unchecked). Returns the
    problems and the NAMEs taken so.
    """
    _, found = _parse(path, {}, True, local_folders=False, env_here=False)
    return found.messages, sorted(found.unset_elsewhere or ())


def accepted_keys(*, delay_router: bool = False) -> frozenset[str]:
    """Every dotted key a handler job's config file may set ("job.name",
    "kafka.security.protocol", ...), or with `delay_router` a delay router's: the keys its
    readers ask for when every table is present ([kafka.security] is read only when it sets
    something). A table of free-form entries ("kafka.options", "dead_letter.routes",
    "delay_router.topics") counts as one key.
    """
    sections = _ROUTER_SECTIONS if delay_router else (*_REQUIRED_SECTIONS, *_OPTIONAL_SECTIONS)
    document: dict[str, Any] = {name: {} for name in sections}
    document["kafka"] = {"security": {"protocol": "PLAINTEXT"}}
    root = Table(Problems(), "", document)
    _build(root, check_imports=False, local_folders=False, source_path="")
    return frozenset(_leaf_keys(root))


def _leaf_keys(t: Table) -> list[str]:
    """The keys `t` asked for, a sub-table's by its own keys when it asked for any."""
    keys = []
    for key in t.known:
        sub = t.tables.get(key)
        keys += _leaf_keys(sub) if sub is not None and sub.known else [t.path(key)]
    return keys


def _parse(
    path: str | Path,
    overrides: Mapping[str, object],
    check_imports: bool,
    *,
    local_folders: bool = True,
    env_here: bool = True,
) -> tuple[AnyConfig | None, Problems]:
    """The config (None when anything is wrong) and every problem found (`check_elsewhere`
    says what `local_folders` and `env_here` off leave out).

    Only a file that cannot be read as TOML stops the checks early.
    """
    problems = Problems()
    if not env_here:
        problems.unset_elsewhere = set()
    data = _read_toml(path, problems)
    if data is None:
        return None, problems
    _apply_overrides(data, overrides, problems)
    data = _interpolate(data, "", problems)
    for key, placeholder in placeholders(data):
        problems.add(
            key, f"still holds the placeholder {placeholder}: replace it with your own value"
        )
    config = _build(
        Table(problems, "", data), check_imports, local_folders, str(Path(path).resolve())
    )
    return (None if problems.entries else config), problems


def _read_toml(path: str | Path, problems: Problems) -> dict[str, Any] | None:
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
    data: dict[str, Any], overrides: Mapping[str, object], problems: Problems
) -> None:
    """Set each dotted key in `data`, creating tables on the way.

    Below an option table ("kafka.options.") the rest of the key is one option name
    ("sasl.mechanism").
    """
    for dotted, value in overrides.items():
        table = next((t for t in OPTION_TABLES if dotted.startswith(f"{t}.")), None)
        if table is not None:
            parts = [*table.split("."), dotted[len(table) + 1 :]]
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


def _interpolate(node: Any, key: str, problems: Problems) -> Any:
    """`node` with ${env:NAME} replaced in every string, noting each such key in
    `problems.from_env` and each NAME in `problems.env_variables`. A reference to an unset
    variable, or a "${" that does not start a well-formed reference, is reported and the value
    left as written.
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
    names = _ENV_REFERENCE.findall(node)
    problems.env_variables.update(names)
    unset = [name for name in names if name not in os.environ]
    if unset and problems.unset_elsewhere is not None:
        problems.unset_elsewhere.update(unset)
    elif unset:
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


_ROUTER_SECTIONS = ("job", "kafka", "delay_router", "metrics")
_HANDLER_SECTIONS = ("handler", "output", "retry", "dead_letter", "hooks", "breaker")


def _build_router(
    root: Table, local_folders: bool, source_path: str
) -> DelayRouterJobConfig | None:
    """A delay router's config ([delay_router] set): no handler, output, retry or dead letter."""
    tables = {
        name: root.table(name, f"a [{name}] table", required=name != "metrics")
        for name in _ROUTER_SECTIONS
    }
    for name in _HANDLER_SECTIONS:
        if name in root.data:
            root.refuse(
                name,
                "a delay router ([delay_router]) forwards records and calls no handler; "
                f"remove [{name}]",
            )
    root.finish()
    job = read_job(tables["job"])
    kafka = read_kafka(tables["kafka"], router=True)
    router = read_delay_router(tables["delay_router"], tables["job"].values.get("name"))
    metrics = read_metrics(tables["metrics"])
    check_locations(root.problems, tables, local_folders)
    if not (job and kafka and router and metrics):
        return None
    return DelayRouterJobConfig(
        job,
        kafka,
        router,
        metrics,
        source_path,
        frozenset(root.problems.from_env),
        frozenset(root.problems.env_variables),
    )


def _build(
    root: Table, check_imports: bool, local_folders: bool, source_path: str
) -> AnyConfig | None:
    """Read every section, then check what spans sections; None when anything is wrong."""
    if "delay_router" in root.data:
        return _build_router(root, local_folders, source_path)
    tables = {
        name: root.table(name, f"a [{name}] table", required=name in _REQUIRED_SECTIONS)
        for name in (*_REQUIRED_SECTIONS, *_OPTIONAL_SECTIONS)
    }
    root.finish()
    job = read_job(tables["job"])
    kafka = read_kafka(tables["kafka"])
    handler = read_handler(tables["handler"], check_imports, os.path.dirname(source_path))
    output = read_output(tables["output"], handler.output_schema if handler else None)
    main_topics = tables["kafka"].values["topics"]
    job_name = tables["job"].values.get("name")
    retry = read_retry(tables["retry"], main_topics, job_name)
    dead_letter = read_dead_letter(
        tables["dead_letter"],
        main_topics,
        job_name,
        tables["retry"].values["tiers"],
        tables["output"].values["table"],
    )
    metrics = read_metrics(tables["metrics"])
    if kafka and kafka.topic_pattern and retry and dead_letter and job_name:
        own = {topic: "retry tier topic" for topic in retry.tier_topics()}
        own.update((topic, "dead-letter topic") for topic in dead_letter.topics())
        own[produced_topic(job_name)] = own[redriven_topic(job_name)] = "control topic"
        check_pattern_topics(root.problems, "kafka.topic_pattern", kafka.topic_pattern, own)
    hooks = read_hooks(tables["hooks"], handler.kind if handler else None)
    breaker = None
    if "breaker" in root.data:
        breaker = read_breaker(tables["breaker"], tables["kafka"].values.get("source"))
    check_key_order(
        tables["retry"], tables["kafka"].values.get("source"), tables["handler"].values.get("kind")
    )
    check_control_topics(root.problems, tables)
    check_locations(root.problems, tables, local_folders)
    non_retryable = tables["retry"].values["non_retryable"]
    handler_paths = tables["handler"].values["paths"]
    token_provider = kafka.security.token_provider if kafka and kafka.security else None
    if token_provider and handler_paths:
        kafka = replace(kafka, import_paths=handler_paths)
        if check_imports:
            check_callable(
                root.problems, "kafka.security.token_provider", token_provider, handler_paths
            )
    if check_imports and non_retryable and handler_paths:
        check_exception_classes(root.problems, "retry.non_retryable", non_retryable, handler_paths)
    if check_imports and dead_letter and dead_letter.routes and handler_paths:
        check_exception_classes(
            root.problems,
            "dead_letter.routes",
            tuple(reference for reference, _ in dead_letter.routes),
            handler_paths,
        )
    if check_imports and hooks and handler_paths:
        for name, reference in hooks.references().items():
            check_callable(root.problems, f"hooks.{name}", reference, handler_paths)
    if check_imports and breaker and breaker.health and handler_paths:
        check_callable(root.problems, "breaker.health", breaker.health, handler_paths)
    if not (job and kafka and handler and output and retry and dead_letter and metrics and hooks):
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
        hooks,
        breaker=breaker,
        env_variables=frozenset(root.problems.env_variables),
    )
