"""The README's first command: `retrylib demo` as a user runs it, in a process of its own."""

from __future__ import annotations

import subprocess
import sys


def test_the_demo_accounts_for_every_order(tmp_path):
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
    assert (tmp_path / "tables" / "orders" / "_delta_log").is_dir()
