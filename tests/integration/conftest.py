"""Fixtures for the integration tests: job configs under tmp_path on the session's broker.

Every test here is marked `slow` (`pytest -m slow` runs them all).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from helpers import JVM_OPTIONS, write_job_toml
from jvm_class_archive import archive_options

from retrylib.config.loader import load_config
from retrylib.config.model import Config
from retrylib.kafka import worker_clients

HANDLERS_DIR = Path(__file__).parent / "handlers"


LONGEST_FILES = (
    "test_crash_recovery.py",  # the crash sweep; about 1,100 worker-s in CI (ci16)
    "test_hdfs_state.py",  # 480
    "test_config_edits.py",  # 450
    "test_connect_job.py",  # 410
    "test_key_order.py",  # 350
    "test_cli.py",  # 300
    "test_yarn.py",  # 170-270 in one process here (2026-12-07), not yet measured in CI
    "test_breaker_outage.py",  # 200
    "test_standalone_cluster.py",  # 200
    "test_table_upkeep.py",  # 170
)
"""The test files that run longest, longest first, handed out before the others: xdist gives
each worker whole files in collection order (`--no-loadscope-reorder`), and one of them handed
out last would run alone after everything else (the rest are a minute or less each)."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.slow)
    first = {name: rank for rank, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: first.get(Path(item.fspath).name, len(first)))  # stable


@pytest.fixture(scope="session", autouse=True)
def spark_class_archive() -> None:
    """Every Spark JVM started through spark-submit from here on maps its classes from the
    virtualenv's class archive (`jvm_class_archive`), unless SPARK_SUBMIT_OPTS is the
    caller's own."""
    if os.environ.get("SPARK_SUBMIT_OPTS") == JVM_OPTIONS:
        os.environ["SPARK_SUBMIT_OPTS"] = archive_options(JVM_OPTIONS)


@pytest.fixture(autouse=True)
def close_kept_consumers() -> Iterator[None]:
    """Close the consumers a test's own reads left in this process's pool (`worker_clients`
    keeps them for a Python worker's next task): kept past the test, they would outlive its
    broker and log its going away."""
    yield
    worker_clients.close_all()


@pytest.fixture
def write_config(tmp_path: Path, bootstrap_servers: str) -> Callable[..., Config]:
    """Write tmp_path/<name>.toml, a job reading `topics` from the test broker with a
    handler from handlers/ (`job_handlers:by_key` by default; `handler_options` add to its
    table), two retry tiers and a dead letter, and load it. `sections` update its tables key
    by key, as in `helpers.job_toml`.
    """

    def write(
        topics: list[str],
        *,
        name: str = "itest",
        handler: str = "job_handlers:by_key",
        handler_options: Mapping[str, Any] | None = None,
        **sections: Mapping[str, Any],
    ) -> Config:
        from job_handlers import OUTPUT_SCHEMA  # on sys.path via HANDLERS_DIR

        defaults: dict[str, dict[str, Any]] = {
            "job": {"trigger": "500ms"},
            "kafka": {"starting_offsets": "earliest"},
            "retry": {"delays": ["1s", "2s"], "max_attempts": 3, "non_retryable": ["ValueError"]},
            "dead_letter": {"topic": f"{topics[0]}.dlt", "table": f"{tmp_path}/dlq"},
        }
        for section, changes in sections.items():
            defaults.setdefault(section, {}).update(changes)
        path = write_job_toml(
            tmp_path / f"{name}.toml",
            topics=topics,
            name=name,
            bootstrap_servers=bootstrap_servers,
            handler={
                "function": handler,
                "output_schema": OUTPUT_SCHEMA,
                "paths": [HANDLERS_DIR],
                **(handler_options or {}),
            },
            **defaults,
        )
        return load_config(path)

    sys.path.insert(0, str(HANDLERS_DIR))
    return write
