#!/usr/bin/env bash
# EMR bootstrap action: a Python 3.11+ with retrylib and its dependencies on every node,
# the interpreter's path in /etc/retrylib/python (submit.sh points Spark at it), and the
# repository (jobs/, deploy/emr/submit.sh) on the primary node.
#
#   bootstrap.sh [--wheels s3://my-bucket/retrylib/wheelhouse/] s3://my-bucket/retrylib/artifacts [PYTHON]
#
# expects under the artifacts prefix:
#   wheels/*.whl          the retrylib wheel and the handler package's wheel
#   retrylib-src.tar.gz   the repository (git archive --format=tar.gz HEAD)
#
# Their dependencies (confluent-kafka, pyarrow, pandas, the handler's own) and Delta's
# Python package come from PyPI, or with --wheels from that folder alone (pip --no-index
# --find-links): a node in a private subnet reaches S3 but no PyPI. deploy/README.md says
# how to stage that folder (pip download, for the nodes' Python and platform).
#
# PYTHON (default python3.11) is a name or path; AL2023's python3 is 3.9 for the life of
# the distribution, too old for retrylib, so a missing python3.N is installed with dnf
# (python3.N and python3.N-pip). Every node must pick the same version: PySpark refuses a
# worker whose minor version differs from the driver's.
#
# pyspark is not installed: the cluster's Spark provides it. The wheels are installed with
# their dependencies; Delta's Python package without them, at the cluster's Delta version
# (DELTA_VERSION below), since its pyspark requirement is the cluster's Spark. Delta's jars
# are the cluster's own (cluster.json: the delta-defaults classification).
set -euo pipefail

usage="usage: bootstrap.sh [--wheels s3://bucket/wheelhouse/] s3://bucket/prefix [python3.11]"
wheelhouse=
if [[ ${1:-} == --wheels ]]; then
  wheelhouse=${2:?$usage}
  shift 2
fi
artifacts=${1:?$usage}
python=${2:-python3.11}
delta_version=4.0.0 # emr-spark-8.0.0 ships Delta 4.0.0
instance_info=${RETRYLIB_INSTANCE_INFO:-/mnt/var/lib/info/instance.json}
etc=${RETRYLIB_ETC:-/etc/retrylib}
home=${RETRYLIB_HOME:-/home/hadoop/retrylib}
work=$(mktemp -d)

if ! command -v "$python" >/dev/null 2>&1; then
  [[ $python == python3.* && $python != */* ]] || {
    echo "bootstrap.sh: $python not found (give a python3.N name to install it with dnf)" >&2
    exit 1
  }
  sudo dnf install -y "$python" "$python-pip"
fi
python=$(command -v "$python")
version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [[ ${version%%.*} -lt 3 || ( ${version%%.*} -eq 3 && ${version#*.} -lt 11 ) ]]; then
  echo "bootstrap.sh: $python is Python $version; retrylib needs 3.11 or newer" >&2
  exit 1
fi
"$python" -m pip --version >/dev/null 2>&1 || sudo dnf install -y "$(basename "$python")-pip"

index=()
if [[ -n $wheelhouse ]]; then
  aws s3 cp --recursive "${wheelhouse%/}/" "$work/wheelhouse/"
  index=(--no-index --find-links "$work/wheelhouse")
fi
aws s3 cp --recursive "${artifacts%/}/wheels/" "$work/wheels/"
sudo "$python" -m pip install "${index[@]}" "$work"/wheels/*.whl
sudo "$python" -m pip install "${index[@]}" --no-deps "delta-spark==$delta_version"

sudo mkdir -p "$etc"
echo "$python" | sudo tee "$etc/python" >/dev/null

if grep -q '"isMaster": *true' "$instance_info"; then
  aws s3 cp "${artifacts%/}/retrylib-src.tar.gz" "$work/"
  mkdir -p "$home"
  tar -xzf "$work/retrylib-src.tar.gz" -C "$home"
fi
