"""The config layer depends on nothing else of retrylib, and loading a config starts no Spark
and no Kafka client library."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import retrylib.config

CONFIG_DIR = Path(retrylib.config.__file__).parent


def test_importing_the_config_loader_imports_neither_kafka_nor_spark():
    script = (
        "import json, sys\n"
        "import retrylib.config.loader\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )

    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )

    loaded = set(json.loads(done.stdout))
    assert "retrylib" in loaded
    assert not loaded & {"confluent_kafka", "pyspark", "py4j"}


def test_config_modules_import_only_config_and_errors_from_retrylib():
    outside = []
    for path in sorted(CONFIG_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            outside += [
                f"{path.name}: {name}"
                for name in names
                if name.split(".")[0] == "retrylib"
                and not name.startswith("retrylib.config")
                and name != "retrylib.errors"
            ]

    assert outside == []
