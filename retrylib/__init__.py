"""retrylib: Kafka retries with delays, a dead-letter path and exactly-once Delta output,
as a PySpark Structured Streaming job.

A handler is a function `handler(record: Record)` returning a dict, a list of dicts or None;
raising fails the record (retried later), `NonRetryable` sends it to the dead letter at
once, `RetryAfter(seconds)` asks for a specific delay, `Skip` drops it (counted, logged).

The names below are imported on first use: every Spark Python worker and streaming source
process imports this package, and most of them need none of the job's modules.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from retrylib.config.loader import load_config
    from retrylib.errors import (
        ConfigError,
        NonRetryable,
        RetryAfter,
        RetrylibError,
        Skip,
        TopicError,
    )
    from retrylib.job import run
    from retrylib.record import Record

_HOMES = {
    "ConfigError": "retrylib.errors",
    "NonRetryable": "retrylib.errors",
    "Record": "retrylib.record",
    "RetryAfter": "retrylib.errors",
    "RetrylibError": "retrylib.errors",
    "Skip": "retrylib.errors",
    "TopicError": "retrylib.errors",
    "load_config": "retrylib.config.loader",
    "run": "retrylib.job",
}

__all__ = [
    "ConfigError",
    "NonRetryable",
    "Record",
    "RetryAfter",
    "RetrylibError",
    "Skip",
    "TopicError",
    "load_config",
    "run",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'retrylib' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
