"""The imports retrylib does not cost Spark's Python processes, seen in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys


def test_reading_kafka_does_not_import_the_job() -> None:
    """Every Spark streaming source process imports retrylib.source.kafka_source; the job's modules
    (Delta, the router, the config parser) would add ~0.1-0.2 s to each one's start."""
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, retrylib.source.kafka_source; "
            "print(sorted(m for m in sys.modules if m.startswith('retrylib')))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "retrylib.job" not in loaded
    assert "retrylib.config.model" not in loaded
    assert "retrylib.config.loader" not in loaded
