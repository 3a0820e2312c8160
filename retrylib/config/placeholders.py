"""What a placeholder is: the `YOUR-...` words the shipped configs and the Databricks bundle's
variables hold where only the user knows the value (YOUR-BUCKET, YOUR-BROKER-1,
YOUR-CATALOG). A config that still holds one would fail only at the first write or
connection, run after run, so it is refused as invalid where it is loaded (`retrylib check`,
`--offline` too, and `run`), and the bundle's entry point refuses a variable left at one.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

_PLACEHOLDER = re.compile(r"\bYOUR-[A-Z][A-Z0-9]*(?:-[A-Z0-9]+)*")


def placeholder_in(value: str) -> str | None:
    """The first placeholder `value` holds ("YOUR-BUCKET"), or None."""
    found = _PLACEHOLDER.search(value)
    return found[0] if found else None


def placeholders(node: Any, key: str = "") -> Iterator[tuple[str, str]]:
    """(dotted key, placeholder) for each string under `node` (a parsed TOML document) that
    holds one, keys as the config's problems name them (`kafka.topics[0]`)."""
    if isinstance(node, dict):
        for name, value in node.items():
            yield from placeholders(value, f"{key}.{name}" if key else name)
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from placeholders(value, f"{key}[{index}]")
    elif isinstance(node, str) and (found := placeholder_in(node)):
        yield key, found
