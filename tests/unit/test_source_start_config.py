"""Where a new job starts reading (`kafka.starting_offsets`, a time included) and what its
readers do with records Kafka deleted (`kafka.fail_on_data_loss`): from the config to the
options of both Kafka sources."""

from __future__ import annotations

from pathlib import Path

import pytest

from retrylib.config.loader import load_config
from retrylib.job.source_frame import _every_topic, source_options
from retrylib.kafka.offsets import AT_TIMESTAMP, StartingOffsets
from retrylib.source.options import parse_source_options
from tests.helpers import problem_for, write_literal_config

NOV_1_8AM_MS = 1_761_984_000_000  # 2025-11-01T08:00:00Z


@pytest.mark.parametrize(
    "literal",
    ['"2025-11-01T08:00:00Z"', '"2025-11-01T09:00:00+01:00"', "2025-11-01T08:00:00Z"],
)
def test_starting_offsets_at_a_time(tmp_path: Path, literal: str) -> None:
    config = load_config(write_literal_config(tmp_path, {"kafka.starting_offsets": literal}))
    assert config.kafka.starting_timestamp_ms == NOV_1_8AM_MS
    main, tiers = source_options(config)
    assert main["startingTimestamp"] == str(NOV_1_8AM_MS)
    assert main["startingOffsetsByTimestampStrategy"] == "latest"
    assert "startingOffsets" not in main
    assert "startingTimestamp" not in tiers  # tiers start at their earliest offsets
    every_topic = parse_source_options(_every_topic(config))
    assert every_topic.starting_offsets == StartingOffsets(AT_TIMESTAMP, timestamp_ms=NOV_1_8AM_MS)


@pytest.mark.parametrize("literal", ['"2025-11-01T08:00:00"', "2025-11-01T08:00:00", '"Nov 1"'])
def test_a_time_without_a_zone_is_refused_naming_the_forms(tmp_path: Path, literal: str) -> None:
    problem = problem_for(tmp_path, {"kafka.starting_offsets": literal})
    assert problem.startswith("kafka.starting_offsets: expected ")
    assert 'a date-time with a zone like "2026-11-01T08:00:00Z"' in problem


def test_starting_offsets_keywords_reach_both_sources(tmp_path: Path) -> None:
    config = load_config(write_literal_config(tmp_path, {"kafka.starting_offsets": '"latest"'}))
    assert config.kafka.starting_timestamp_ms is None
    main, _ = source_options(config)
    assert main["startingOffsets"] == "latest"
    assert "startingTimestamp" not in main
    assert _every_topic(config)["startingOffsets"] == "latest"


@pytest.mark.parametrize(("literal", "expected"), [(None, True), ("false", False)])
def test_fail_on_data_loss_reaches_every_reader(
    tmp_path: Path, literal: str | None, expected: bool
) -> None:
    changes = {} if literal is None else {"kafka.fail_on_data_loss": literal}
    config = load_config(write_literal_config(tmp_path, changes))
    assert config.kafka.fail_on_data_loss is expected
    main, tiers = source_options(config)
    assert main["failOnDataLoss"] == tiers["failOnDataLoss"] == str(expected).lower()
    assert parse_source_options(tiers).fail_on_data_loss is expected
    assert parse_source_options(_every_topic(config)).fail_on_data_loss is expected


def test_fail_on_data_loss_must_be_a_boolean(tmp_path: Path) -> None:
    problem = problem_for(tmp_path, {"kafka.fail_on_data_loss": '"no"'})
    assert problem == (
        'kafka.fail_on_data_loss: expected true or false, got "no"; '
        "write it like fail_on_data_loss = true"
    )
