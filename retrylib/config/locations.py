"""Where the job keeps its state: the checks that the checkpoint and each Delta table setting
name a valid place, each its own and none inside another, and a local one a folder this
user can create or write (looked at, never created: loading a config changes nothing).
"""

from __future__ import annotations

import json
import os
import posixpath
import re
from collections.abc import Mapping

from retrylib.config.table_ref import TableRef, is_uri
from retrylib.config.values import Problems, Table
from retrylib.errors import ConfigError

_SCHEME_ALIASES = {"s3a": "s3", "s3n": "s3", "abfss": "abfs", "wasbs": "wasb"}
"""Schemes that name one store's places through another connector, or over TLS: `s3a://b/x`
and `s3://b/x` are one object."""
_SLASHES = re.compile(r"/{2,}")
_LOCAL_HOSTS = ("", "localhost")

_LOCATIONS = (
    ("job", "checkpoint"),
    ("output", "table"),
    ("dead_letter", "table"),
    ("metrics", "table"),
)


def check_locations(problems: Problems, tables: Mapping[str, Table], local_folders: bool) -> None:
    """The checkpoint and each Delta table need a location of their own, none inside
    another (a table inside the checkpoint, a table inside a table's folder); with
    `local_folders`, one named by a local path a folder this user can write or create.
    """
    owners: dict[str, str] = {}
    paths: list[tuple[str, str]] = []  # (key, location id) of each path, not catalog names
    for section, key in _LOCATIONS:
        location = tables[section].values.get(key) if section in tables else None
        if location is None:
            continue
        dotted = f"{section}.{key}"
        where = location_id(location)
        problems.claim(owners, dotted, where, "the checkpoint and each table need their own")
        if section == "job" or _is_path(location):
            paths.append((dotted, where))
            if local_folders and not is_uri(location):
                unusable = _unusable_folder(where)
                if unusable is not None:
                    problems.add(dotted, unusable)
    for key, where in paths:
        for outer_key, outer in paths:
            if where.startswith(outer.rstrip("/") + "/"):
                problems.add(
                    key,
                    f"{json.dumps(where)} is inside {outer_key} {json.dumps(outer)}; give each "
                    "table and the checkpoint a location of its own, none inside another",
                )


def _unusable_folder(path: str) -> str | None:
    """Why the local folder `path` cannot hold the job's state, or None when it is a folder
    this user may write, or may be created."""
    shown = json.dumps(path)
    if os.path.exists(path):
        if not os.path.isdir(path):
            return f"{shown} is a file; name a folder (it is created when missing)"
        if not os.access(path, os.W_OK | os.X_OK):
            return f"{shown} is a folder this user cannot write; grant write access or name another"
        return None
    parent = os.path.dirname(path)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        return f"{shown} cannot be created: {json.dumps(parent)} is a file; name another folder"
    if not os.access(parent, os.W_OK | os.X_OK):
        return (
            f"{shown} cannot be created: this user cannot write {json.dumps(parent)}; grant "
            "write access or name another folder"
        )
    return None


def location_id(location: str) -> str:
    """`location` in one spelling per place, so that equal places compare equal: a local path
    (a plain one, or a `file:` URI) absolute with its symlinks resolved, a URI's scheme folded
    with its aliases (`s3a`, `s3n` -> `s3`), and no doubled, trailing or `.`/`..` parts.

    What the spelling alone cannot tell, such as a plain path that Spark resolves against an
    HDFS default file system, Hadoop tells (`retrylib.state.files.qualified_location`, which
    gives its answer through this function too).
    """
    if not is_uri(location):
        return os.path.realpath(location)
    scheme, rest = location.split(":", 1)
    scheme = _SCHEME_ALIASES.get(scheme.lower(), scheme.lower())
    authority = ""
    if rest.startswith("//"):
        authority, _, rest = rest[2:].partition("/")
    path = posixpath.normpath(_SLASHES.sub("/", f"/{rest}"))
    if scheme == "file" and authority in _LOCAL_HOSTS:
        return os.path.realpath(path)
    return f"{scheme}://{authority}{path}"


def _is_path(table: str) -> bool:
    """True when the table setting `table` names a path or URI (not a catalog table)."""
    try:
        return TableRef.parse(table, "table").is_path
    except ConfigError:
        return False  # reported where the setting was read


def check_table_name(t: Table, key: str, table: str | None) -> None:
    """Report a Delta table setting that is neither a path/URI nor a catalog table name."""
    if table is None:
        return
    where = t.path(key)
    try:
        TableRef.parse(table, where)
    except ConfigError as e:
        t.problems.add(where, str(e).removeprefix(f"{where}: "))
