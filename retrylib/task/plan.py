"""A handler job's routing task plan: what every routing task of a batch is given."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import pyarrow as pa


@dataclass(frozen=True)
class TaskPlan:
    """Everything a task needs, built once per batch on the driver and shipped in the closure.

    `now_ms` is read once per batch run, so every record of the run is judged at one time.
    """

    job: str
    batch_id: int
    now_ms: int
    handler: str
    handler_paths: tuple[str, ...]
    handler_timeout_ms: int | None
    output_schema: pa.Schema
    dead_letter_topic: str
    retry_topics: Mapping[str, tuple[str, ...]]  # main topic -> topic of each tier
    tier_delays_ms: tuple[int, ...]
    partition_counts: Mapping[str, int]  # retry and dead-letter topics -> partitions
    max_attempts: int
    jitter: float
    non_retryable: tuple[str, ...]
    max_retry_after_ms: int
    signing_key: bytes  # signs every outgoing record; a retry record must carry its signature
    handler_kind: str = "record"
    handler_parallelism: int = 1  # lanes per task (`lanes`), for record handlers
    bootstrap_servers: str = ""  # and client_options: how the task reads offset ranges
    client_options: Mapping[str, str] = field(default_factory=dict)
    secret_options: tuple[str, ...] = ()  # names among client_options, masked in logs
    fail_on_data_loss: bool = True
    hooks: Mapping[str, str] = field(default_factory=dict)  # record hook -> "module:function"
    isolate: bool = False  # each handler call in its own process (after a worker died)
    # Retry and dead-letter topic -> the largest record it accepts (`record_size`); a topic
    # missing here is not checked.
    max_record_bytes: Mapping[str, int] = field(default_factory=dict)
    retry_timeout_ms: int | None = None
    dead_letter_routes: tuple[tuple[str, str], ...] = ()  # (exception class name, topic)
    key_ordered: bool = False  # a key's later records wait behind its retries (`retry.key_order`)
    # Retries due up to this long after `now_ms` are read in this batch and wait to be due.
    read_ahead_ms: int = 0

    def isolated(self) -> TaskPlan | None:
        """This plan with each handler call in a process of its own, or None when it is so."""
        return None if self.isolate else replace(self, isolate=True)
