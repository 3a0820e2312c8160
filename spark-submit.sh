#!/usr/bin/env bash
# Run a retrylib job through spark-submit.
#
#   ./spark-submit.sh conf/orders.toml [--available-now]
#   ./spark-submit.sh status|redrive conf/orders.toml [OPTIONS]    # that retrylib command
#
# Ships the retrylib package to the executors with --py-files (the handler's own package
# is shipped by the job itself), without what runs on neither side of the job: the folder
# retrylib/dev/ (the embedded broker for the demo and tests, the jar resolver, the demo).
# The driver's modules stay: spark-submit puts the bundle first on the driver's Python
# path too, so the driver runs from it. With a Spark installed from PyPI into a virtualenv
# (the project's .venv: spark-submit beside the interpreter, pyvenv.cfg above it) it adds
# Spark's Kafka connector and Delta Lake, resolved once by `python -m retrylib.dev.jars`;
# any other spark-submit (a cluster's, on PATH) brings its own and gets none. With the
# virtualenv's Spark the driver JVM also maps its classes from a class-data-sharing archive,
# made once per virtualenv and Java build (retrylib/dev/class_archive.py; turned off by
# RETRYLIB_CLASS_ARCHIVE=off). Extra spark-submit flags go in RETRYLIB_SPARK_EXTRA, e.g.
# RETRYLIB_SPARK_EXTRA="--master yarn" (the name deploy/emr/submit.sh reads too). Jars and
# Spark settings for every entry point (this script, `retrylib run`, `status`, `redrive`)
# go in RETRYLIB_SPARK_JARS (comma-separated) and RETRYLIB_SPARK_CONF (key=value pairs),
# e.g. S3A's (docs/deploy.md); they, and a --jars in RETRYLIB_SPARK_EXTRA, join this
# script's own jars in one --jars (retrylib/spark/extra.py).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [[ $# -lt 1 ]]; then
  echo "usage: $0 CONFIG.toml [--available-now] | $0 status|redrive CONFIG.toml [OPTIONS]" >&2
  exit 2
fi
# Its former name: a run without the flags it holds (say --master yarn) would run elsewhere.
if [[ -n "${SPARK_SUBMIT_OPTS_EXTRA:-}" ]]; then
  echo "$0: SPARK_SUBMIT_OPTS_EXTRA is now called RETRYLIB_SPARK_EXTRA: rename it" >&2
  exit 2
fi

if [[ -z "${PYSPARK_PYTHON:-}" ]]; then
  if [[ -x "$here/.venv/bin/python" ]]; then
    PYSPARK_PYTHON="$here/.venv/bin/python"
  else
    PYSPARK_PYTHON=$(command -v python3)
  fi
fi
export PYSPARK_PYTHON PYSPARK_DRIVER_PYTHON="${PYSPARK_DRIVER_PYTHON:-$PYSPARK_PYTHON}"

bin=$(dirname "$PYSPARK_PYTHON")
submit=$bin/spark-submit
jvm_flags=()
own_jars=""
# One line per word of what `python -m retrylib.spark.extra` prints (none for no output).
words() { [[ -z $1 ]] || mapfile -t "$2" <<< "$1"; }
# A system interpreter (/usr/bin/python3.11 on EMR) may sit beside the cluster's own
# spark-submit: only a virtualenv's is the PyPI Spark that needs the jars.
venv_spark=false
[[ -x "$submit" && -f "$bin/../pyvenv.cfg" ]] && venv_spark=true
if $venv_spark; then
  own_jars=$("$PYSPARK_PYTHON" -m retrylib.dev.jars spark --classpath)
  # The snapshot partitions as retrylib.spark.session sets them for a local Spark: Delta's
  # default of 50 tasks per table-state rebuild costs a local run a second per append.
  jvm_flags=(--conf spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension
    --conf spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog
    --conf spark.databricks.delta.snapshotPartitions=2)
else
  submit=$(command -v spark-submit)
fi
user_flags=() submit_flags=()
printed=$(cd "$here" && "$PYSPARK_PYTHON" -m retrylib.spark.extra "$own_jars") || exit 2
words "$printed" user_flags
printed=$(cd "$here" && "$PYSPARK_PYTHON" -m retrylib.spark.extra --rest) || exit 2
words "$printed" submit_flags
jvm_flags+=(${user_flags[@]+"${user_flags[@]}"})
if $venv_spark; then
  # The class archive's options before the caller's. The first run finds no archive, runs
  # without one, and starts its making in the background once this job ($$: the JVM after
  # the exec below) has started.
  if opts=$("$PYSPARK_PYTHON" -m retrylib.dev.class_archive --job $$ \
      -- "$submit" "${jvm_flags[@]}"); then
    export SPARK_SUBMIT_OPTS=$opts
  fi
fi

bundle="$here/build/retrylib-py.zip"
mkdir -p "$here/build"
# Built beside its name and renamed into place only when it differs: another run from this
# checkout (a job, a `status`) may be reading the bundle, and a zip rewritten under a reader
# fails its next import (EOFError).
(cd "$here" && "$PYSPARK_PYTHON" -c "
import os, sys, zipfile, pathlib
bundle = pathlib.Path(sys.argv[1])
fresh = bundle.with_name(f'{bundle.name}.{os.getpid()}')
with zipfile.ZipFile(fresh, 'w') as z:
    for path in sorted(pathlib.Path('retrylib').rglob('*.py')):
        if path.parts[1] != 'dev':
            z.write(path)
if bundle.exists() and bundle.read_bytes() == fresh.read_bytes():
    fresh.unlink()
else:
    os.replace(fresh, bundle)
" "$bundle")

exec "$submit" ${jvm_flags[@]+"${jvm_flags[@]}"} ${submit_flags[@]+"${submit_flags[@]}"} \
  --py-files "$bundle" "$here/jobs/run_job.py" "$@"
