#!/usr/bin/env bash
# Create .venv with retrylib (editable) and everything the demo and the tests need, then
# fetch the JVM jars once: Spark's Kafka connector, Delta Lake and Apache Kafka's broker.
set -euo pipefail
cd "$(dirname "$0")"
python=${PYTHON:-python3}
java -version >/dev/null 2>&1 || { echo "setup.sh: Java 17 is needed by Spark and Kafka (java not found)" >&2; exit 1; }
command -v mvn >/dev/null 2>&1 || { echo "setup.sh: Maven is needed once to fetch Spark's Kafka connector, Delta Lake and Apache Kafka (mvn not found; e.g. apt install maven)" >&2; exit 1; }
[[ -x .venv/bin/python ]] || "$python" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[spark,test]"
.venv/bin/python -m retrylib.jars
