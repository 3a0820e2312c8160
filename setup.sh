#!/usr/bin/env bash
# Create .venv with retrylib (editable) and everything the demo and the tests need.
set -euo pipefail
cd "$(dirname "$0")"
python=${PYTHON:-python3}
[[ -x .venv/bin/python ]] || "$python" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[spark,embedded,test]"
java -version >/dev/null 2>&1 || { echo "setup.sh: Java 17 is needed by Spark (java not found)" >&2; exit 1; }
