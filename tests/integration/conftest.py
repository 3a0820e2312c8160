"""Helpers for the integration tests: job configs under tmp_path, producing, reading tables."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

from retrylib.config.loader import load_config
from retrylib.config.model import Config
from retrylib.kafka.clients import make_producer

HANDLERS_DIR = Path(__file__).parent / "handlers"


@pytest.fixture
def write_config(tmp_path: Path, bootstrap_servers: str) -> Callable[..., Config]:
    """Write a job config for `topics` under tmp_path and load it; `kafka` is raw TOML
    added to [kafka], `extra` raw TOML added at the end."""

    def write(
        topics: list[str],
        *,
        name: str = "itest",
        extra: str = "",
        retry: str = 'delays = ["1s", "2s"]\nmax_attempts = 3',
        handler: str = "job_handlers:by_key",
        kafka: str = "",
        output_table: str | None = None,
        dead_letter_table: str | None = None,
        checkpoint: str | None = None,
    ) -> Config:
        from job_handlers import OUTPUT_SCHEMA  # noqa: PLC0415 - on sys.path via HANDLERS_DIR

        path = tmp_path / f"{name}.toml"
        path.write_text(f"""
[job]
name = "{name}"
checkpoint = "{checkpoint or f"{tmp_path}/checkpoint"}"
trigger = "500ms"
[kafka]
bootstrap_servers = "{bootstrap_servers}"
topics = {json.dumps(list(topics))}
starting_offsets = "earliest"
{kafka}
[handler]
function = "{handler}"
output_schema = "{OUTPUT_SCHEMA}"
paths = ["{HANDLERS_DIR}"]
[output]
table = "{output_table or f"{tmp_path}/out"}"
[retry]
{retry}
non_retryable = ["ValueError"]
[dead_letter]
topic = "{topics[0]}.dlt"
table = "{dead_letter_table or f"{tmp_path}/dlq"}"
{extra}
""")
        return load_config(path)

    sys.path.insert(0, str(HANDLERS_DIR))
    return write


def produce(
    bootstrap: str, topic: str, records: Iterable[tuple[str, str]], partitions: int | None = None
) -> int:
    """Produce (key, value) string pairs, spread over `partitions` round-robin if given."""
    producer = make_producer(bootstrap, {})
    count = 0
    for i, (key, value) in enumerate(records):
        kwargs = {"partition": i % partitions} if partitions else {}
        producer.produce(topic, key=key.encode(), value=value.encode(), **kwargs)
        count += 1
    producer.flush(30)
    return count
