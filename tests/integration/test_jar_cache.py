"""The jars resolved by setup are cached: resolving again needs neither Maven nor network."""

from __future__ import annotations

import os
import subprocess
import sys


def test_a_second_resolution_runs_no_maven(tmp_path):
    # setup.sh resolved both sets already; with no `mvn` on PATH, only the cache can answer.
    env = {**os.environ, "PATH": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "retrylib.dev.jars", "spark", "kafka", "--classpath"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    jars = done.stdout.strip().split(",")
    names = {os.path.basename(jar) for jar in jars}
    assert all(os.path.isfile(jar) for jar in jars)
    assert any(name.startswith("spark-sql-kafka-0-10_2.13-") for name in names)
    assert any(name.startswith("delta-spark_") for name in names)
    assert any(name.startswith("kafka_2.13-") for name in names)


def test_without_maven_and_cache_the_error_says_what_to_install(tmp_path):
    env = {**os.environ, "PATH": str(tmp_path), "RETRYLIB_JARS": str(tmp_path / "empty")}
    done = subprocess.run(
        [sys.executable, "-m", "retrylib.dev.jars", "kafka"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 1
    assert "Maven (mvn) is needed" in done.stderr
