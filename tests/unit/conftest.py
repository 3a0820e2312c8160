"""Fixtures for the unit tests."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
import pytest
from helpers import REPO, TIER

from retrylib.task.forwarding import ForwardPlan
from retrylib.task.plan import TaskPlan


@pytest.fixture
def plan() -> TaskPlan:
    """An executor task's plan for job "job" on topic "orders": two retry tiers (TIER, 5 s,
    then 1 m), three attempts, the handler `unit_handlers:by_key`."""
    return TaskPlan(
        job="job",
        batch_id=4,
        now_ms=int(time.time() * 1000),
        handler="unit_handlers:by_key",
        handler_paths=(str(Path(__file__).parent),),
        handler_timeout_ms=None,
        output_schema=pa.schema(
            [
                ("key", pa.string()),
                ("topic", pa.string()),
                ("offset", pa.int64()),
                ("attempt", pa.int32()),
            ]
        ),
        dead_letter_topic="orders.dlt",
        retry_topics={"orders": (TIER, "orders.retry.1m")},
        tier_delays_ms=(5000, 60000),
        partition_counts={TIER: 3, "orders.retry.1m": 3, "orders.dlt": 3},
        max_attempts=3,
        jitter=0.0,
        non_retryable=("ValueError",),
        max_retry_after_ms=3_600_000,
        signing_key=b"s" * 32,
    )


@pytest.fixture
def forward_plan() -> ForwardPlan:
    """A delay router task's plan: delay topic "delays" (1 s), forwarding by the `final_topic`
    and `msg_ts` headers, no fallback topic, batch clock at 10 s."""
    return ForwardPlan(
        job="router",
        delays_ms={"delays": 1_000},
        target_header="final_topic",
        timestamp_header="msg_ts",
        fallback_topic=None,
        bootstrap_servers="b:9092",
        client_options={},
        now_ms=10_000,
    )


@pytest.fixture
def run_from_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run from the repository root: handler.paths defaults to ".", and the configs name
    orders_handlers.handlers."""
    monkeypatch.chdir(REPO)
