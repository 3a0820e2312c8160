"""A Delta table as the config names it: a path or URI, or a catalog name.

A table is named in the config by a path or URI (`s3://b/x`, `/Volumes/c/s/v/x`, `./x`) or by
a catalog name (`db.t`, `catalog.db.t`); `TableRef.parse` tells them apart at the config edge.
Pure: no Spark.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from retrylib.errors import ConfigError

# A URI scheme as RFC 3986 spells it, followed by ':' (s3:, abfss:, dbfs:, file:).
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:")


def is_uri(location: str) -> bool:
    """True when `location` starts with a URI scheme (`s3://b/x`, `file:/x`, `dbfs:/x`): a
    place for Spark's (Hadoop's) file systems, not a plain local path."""
    return _SCHEME.match(location) is not None


# Spark accepts these characters in an identifier without backquotes.
_UNQUOTED_PART = re.compile(r"[A-Za-z0-9_]+")
_FIX = "write ./{name} for a folder, or db.{name} for a catalog table"


class _NotAName(ValueError):
    """Raised inside `TableRef.parse` when a text is no catalog name; carries the reason."""


@dataclass(frozen=True)
class TableRef:
    """A Delta table as the config names it: a path or URI (`is_path`), else a catalog name.

    `text` is kept exactly as written; Spark receives it as is, except that `resolved()`
    makes a relative local path absolute.
    """

    text: str
    is_path: bool

    @classmethod
    def parse(cls, text: str, key: str) -> TableRef:
        """Read a table reference from config key `key`, without touching Spark.

        Anything containing '/' or starting with a URI scheme and ':' is a path; otherwise it
        must be a catalog name of 2 or 3 dot-separated identifiers, each made of letters,
        digits and '_' or backquoted (`` `my-cat`.db.t ``, a backquote inside doubled).

        Raises `ConfigError` naming `key`, echoing the value and giving the fix for anything
        else: not a string, empty, surrounding spaces, a bare word, 1 or 4+ parts, other
        characters outside backquotes.
        """
        if not isinstance(text, str):
            raise ConfigError(
                f"{key}: expected a table path or catalog name as a string, got {text!r}; "
                + _FIX.format(name="orders")
            )
        if not text.strip():
            raise ConfigError(f"{key}: {text!r} is empty; " + _FIX.format(name="orders"))
        if text != text.strip():
            raise ConfigError(
                f"{key}: {text!r} has spaces around it; write {text.strip()!r} without them"
            )
        if "/" in text or is_uri(text):
            return cls(text, is_path=True)
        try:
            parts = _name_parts(text)
        except _NotAName as e:
            raise ConfigError(
                f"{key}: {text!r} is neither a path nor a catalog table name ({e}); "
                + _FIX.format(name="orders")
            ) from e
        if len(parts) == 1:
            raise ConfigError(
                f"{key}: {text!r} is ambiguous, a bare name is neither a path nor a catalog "
                "table name; " + _FIX.format(name=text if text == parts[0] else "orders")
            )
        if len(parts) > 3:
            raise ConfigError(
                f"{key}: {text!r} has {len(parts)} dot-separated parts, a catalog table name "
                "has 2 (db.table) or 3 (catalog.db.table); " + _FIX.format(name="orders")
            )
        return cls(text, is_path=False)

    def resolved(self) -> TableRef:
        """This reference with a relative local path made absolute against the current
        directory, so that where Spark's JVM runs from does not matter.

        URIs, absolute paths and catalog names come back unchanged.
        """
        if not self.is_path or is_uri(self.text) or os.path.isabs(self.text):
            return self
        return TableRef(os.path.abspath(self.text), is_path=True)

    @property
    def sql_name(self) -> str:
        """The table as Spark SQL names it: ``delta.`<path>` `` for a path, else the name."""
        if self.is_path:
            return "delta.`" + self.text.replace("`", "``") + "`"
        return self.text

    def __str__(self) -> str:
        return self.text


def _name_parts(text: str) -> list[str]:
    """Split a dotted identifier into its parts, unquoting backquoted ones.

    Raises `_NotAName` saying what is wrong.
    """
    parts: list[str] = []
    i = 0
    while True:
        quoted = text.startswith("`", i)
        if quoted:
            part, i = _backquoted_part(text, i)
        else:
            match = _UNQUOTED_PART.match(text, i)
            part = match.group() if match else ""
            i = match.end() if match else i
        if not quoted and (not part or (i < len(text) and text[i] != ".")):
            bad = repr(text[i]) if i < len(text) else "end"
            raise _NotAName(
                f"unexpected {bad} at position {i}: a part without backquotes may hold only "
                "letters, digits and _; backquote other parts, as in `my-cat`.db.t"
            )
        if i < len(text) and text[i] != ".":
            raise _NotAName(f"expected '.' after `{part}` at position {i}, found {text[i]!r}")
        parts.append(part)
        if i == len(text):
            return parts
        i += 1


def _backquoted_part(text: str, start: int) -> tuple[str, int]:
    """The unquoted part that starts with the backquote at `start`, and the index after it."""
    pieces = []
    i = start + 1
    while True:
        end = text.find("`", i)
        if end < 0:
            raise _NotAName(f"the backquote at position {start} is not closed")
        pieces.append(text[i:end])
        if not text.startswith("``", end):
            break
        # A doubled backquote stands for one backquote inside the part.
        pieces.append("`")
        i = end + 2
    part = "".join(pieces)
    if not part:
        raise _NotAName(f"the backquoted part at position {start} is empty")
    return part, end + 1
