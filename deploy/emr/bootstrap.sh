#!/usr/bin/env bash
# EMR bootstrap action: retrylib and its Python dependencies on every node, and the
# repository (spark-submit.sh, jobs/) on the primary node.
#
#   bootstrap.sh s3://my-bucket/retrylib/artifacts
#
# expects under that prefix:
#   wheels/*.whl          the retrylib wheel and the handler package's wheel
#   retrylib-src.tar.gz   the repository (git archive --format=tar.gz HEAD)
#
# pyspark is not installed: the cluster's Spark provides it. Delta's Python package is
# installed without dependencies at the cluster's Delta version (DELTA_VERSION, 4.0.0 on
# emr-spark-8.0.0); its jars come with the step's --packages. RETRYLIB_PYTHON picks the
# interpreter (python3).
set -euo pipefail

artifacts=${1:?usage: bootstrap.sh s3://bucket/prefix}
python=${RETRYLIB_PYTHON:-python3}
work=$(mktemp -d)

aws s3 cp --recursive "${artifacts%/}/wheels/" "$work/wheels/"
sudo "$python" -m pip install --no-deps "$work"/wheels/*.whl "delta-spark==${DELTA_VERSION:-4.0.0}"
sudo "$python" - <<'PY'
import importlib.metadata
import re
import subprocess
import sys

provided = {"pyspark", "delta-spark"}
wanted = [
    requirement
    for requirement in importlib.metadata.requires("retrylib") or []
    if "extra ==" not in requirement
    and re.match(r"[A-Za-z0-9._-]+", requirement)[0].lower() not in provided
]
subprocess.check_call([sys.executable, "-m", "pip", "install", *wanted])
PY

if grep -q '"isMaster": *true' /mnt/var/lib/info/instance.json; then
  aws s3 cp "${artifacts%/}/retrylib-src.tar.gz" "$work/"
  mkdir -p /home/hadoop/retrylib
  tar -xzf "$work/retrylib-src.tar.gz" -C /home/hadoop/retrylib
fi
