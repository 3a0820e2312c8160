"""retrylib: Kafka retries with delays, a dead-letter path and exactly-once Delta output,
as a PySpark Structured Streaming job.

A handler is a function `handler(record: Record)` returning a dict, a list of dicts or None;
raising fails the record (retried later), `NonRetryable` sends it to the dead letter at
once, `RetryAfter(seconds)` asks for a specific delay.
"""

from __future__ import annotations

from retrylib.config import load_config
from retrylib.errors import ConfigError, NonRetryable, RetryAfter, RetrylibError, TopicError
from retrylib.job import run
from retrylib.record import Record

__all__ = [
    "ConfigError",
    "NonRetryable",
    "Record",
    "RetryAfter",
    "RetrylibError",
    "TopicError",
    "load_config",
    "run",
]
