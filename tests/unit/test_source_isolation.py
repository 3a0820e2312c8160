"""Records of aborted transactions never reach the handler: both Kafka sources read
read_committed; a user's isolation.level applies to the main topics only."""

from __future__ import annotations

from pathlib import Path

from helpers import write_literal_config

from retrylib.config.loader import load_config
from retrylib.job.source_frame import source_options


def test_both_sources_read_committed_records_by_default(tmp_path: Path) -> None:
    main, tiers = source_options(load_config(write_literal_config(tmp_path)))

    assert main["kafka.isolation.level"] == "read_committed"
    assert tiers["kafka.isolation.level"] == "read_committed"


def test_a_users_isolation_level_reaches_the_main_topics_only(tmp_path: Path) -> None:
    extra = '[kafka.options]\n"isolation.level" = "read_uncommitted"\n'

    main, tiers = source_options(load_config(write_literal_config(tmp_path, extra=extra)))

    assert main["kafka.isolation.level"] == "read_uncommitted"
    assert tiers["kafka.isolation.level"] == "read_committed"
