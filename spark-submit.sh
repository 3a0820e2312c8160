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
# RETRYLIB_SPARK_EXTRA="--master yarn" (the name deploy/emr/submit.sh reads too).
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
# A system interpreter (/usr/bin/python3.11 on EMR) may sit beside the cluster's own
# spark-submit: only a virtualenv's is the PyPI Spark that needs the jars.
if [[ -x "$submit" && -f "$bin/../pyvenv.cfg" ]]; then
  jars=$("$PYSPARK_PYTHON" -m retrylib.dev.jars spark --classpath)
  # The snapshot partitions as retrylib.spark.session sets them for a local Spark: Delta's
  # default of 50 tasks per table-state rebuild costs a local run a second per append.
  jvm_flags=(--jars "$jars"
    --conf spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension
    --conf spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog
    --conf spark.databricks.delta.snapshotPartitions=2)
  # The class archive's options before the caller's. The first run finds no archive, runs
  # without one, and starts its making in the background once this job ($$: the JVM after
  # the exec below) has started.
  if opts=$("$PYSPARK_PYTHON" -m retrylib.dev.class_archive --job $$ \
      -- "$submit" "${jvm_flags[@]}"); then
    export SPARK_SUBMIT_OPTS=$opts
  fi
else
  submit=$(command -v spark-submit)
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

# shellcheck disable=SC2086
exec "$submit" "${jvm_flags[@]}" ${RETRYLIB_SPARK_EXTRA:-} --py-files "$bundle" "$here/jobs/run_job.py" "$@"
