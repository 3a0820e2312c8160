"""What Spark's Python processes import: retrylib's modules a source process does not need
(seen in a fresh interpreter), and those a job imports in its workers ahead of its first batch."""

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


def test_a_job_start_imports_the_task_modules_in_a_python_worker_per_core(spark) -> None:
    """The job that `start_python_workers` runs while a query starts: one task per core, each
    importing `TASK_MODULES` in its Python worker; a module that fails to import there fails
    the job. That the first batch then reuses those workers (Spark's worker reuse) is not
    checked here: the tests' session keeps other tests' idle workers too. Measured in the
    lateness bench: the first batch 6.7-7.0 s instead of 8.3-9.7 s."""
    from retrylib.job.python_workers import start_python_workers

    assert start_python_workers(spark, 2).result() == 2
