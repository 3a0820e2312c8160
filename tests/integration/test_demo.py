"""The README's first command: `retrylib demo` as a user runs it, in a process of its own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

_LOG_LINE = "log (Spark's warnings, each batch's metrics): "


def test_the_demo_accounts_for_every_order_and_keeps_its_console_to_the_story(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "retrylib",
            "demo",
            "--records",
            "60",
            "--workdir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )

    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "all 60 orders accounted for: output or dead letter, each exactly once" in done.stdout
    assert "batch 0: 60 new orders read; " in done.stdout
    assert (tmp_path / "tables" / "orders" / "_delta_log").is_dir()
    console = (done.stdout + done.stderr).splitlines()
    assert [line for line in console if "WARN" in line or "{" in line] == []
    log_path = Path(next(line for line in console if line.startswith(_LOG_LINE))[len(_LOG_LINE) :])
    log = log_path.read_text().splitlines()
    metrics = [
        json.loads(line.split(" retrylib.metrics: ", 1)[1])
        for line in log
        if " retrylib.metrics: " in line
    ]
    assert metrics and metrics[0]["batch_id"] == 0 and metrics[0]["records_main"] == 60
    assert any(" WARN " in line for line in log)
