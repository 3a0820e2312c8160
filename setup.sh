#!/usr/bin/env bash
# Create a virtualenv with retrylib (editable) and everything the demo and the tests need, then
# fetch the JVM jars once: Spark's Kafka connector, Delta Lake, Apache Kafka's broker, Hadoop's
# S3A with the AWS SDK modules it calls, and for the tests Hadoop's MiniDFSCluster and
# MiniYARNCluster (tests/hdfs_cluster.py, tests/yarn_cluster.py). Last, it puts bytecode into
# pyspark's own python/lib/pyspark.zip, from which every Python process Spark starts imports
# pyspark (tests/pyspark_zip_bytecode.py says why).
#
#   ./setup.sh               .venv          pyspark 4.2.0, delta-spark 4.4.0 (the default)
#   ./setup.sh --spark 4.1   .venv-spark41  pyspark 4.1.1, delta-spark 4.4.0
#   ./setup.sh --spark 4.0   .venv-spark40  pyspark 4.0.0, delta-spark 4.0.1
#
# Each Spark line is pinned to the release whose Kafka connector resolves with all its
# dependencies (spark-token-provider-kafka-0-10 is published for 4.0.0, 4.1.1 and 4.2.0
# only), and to a delta-spark whose Python package accepts that pyspark.
set -euo pipefail
cd "$(dirname "$0")"
python=${PYTHON:-python3}
line=4.2
if [[ $# -gt 0 ]]; then
  [[ $# -eq 2 && $1 == --spark ]] || { echo "usage: $0 [--spark 4.0|4.1|4.2]" >&2; exit 2; }
  line=$2
fi
case $line in
  4.2) venv=.venv pins=(pyspark==4.2.0 delta-spark==4.4.0) ;;
  4.1) venv=.venv-spark41 pins=(pyspark==4.1.1 delta-spark==4.4.0) ;;
  4.0) venv=.venv-spark40 pins=(pyspark==4.0.0 delta-spark==4.0.1) ;;
  *) echo "setup.sh: --spark $line: choose 4.0, 4.1 or 4.2" >&2; exit 2 ;;
esac
java -version >/dev/null 2>&1 || { echo "setup.sh: Java 17 is needed by Spark and Kafka (java not found)" >&2; exit 1; }
command -v mvn >/dev/null 2>&1 || { echo "setup.sh: Maven is needed once to fetch Spark's Kafka connector, Delta Lake and Apache Kafka (mvn not found; e.g. apt install maven)" >&2; exit 1; }
[[ -x $venv/bin/python ]] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q -e ".[spark,test]" "${pins[@]}"
"$venv/bin/python" -m retrylib.dev.jars spark kafka s3
"$venv/bin/python" tests/hdfs_cluster.py
"$venv/bin/python" tests/yarn_cluster.py
"$venv/bin/python" tests/pyspark_zip_bytecode.py
