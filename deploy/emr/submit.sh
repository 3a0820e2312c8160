#!/usr/bin/env bash
# EMR step (see step.json): fetch the job's config, check it, and run jobs/run_job.py with the
# cluster's spark-submit on YARN, the driver on the primary node (client mode), and the
# Python that bootstrap.sh installed into as PYSPARK_PYTHON. A failed run is started again
# (see below).
#
#   submit.sh s3://my-bucket/retrylib/conf/orders.toml [--available-now]
#   submit.sh status s3://my-bucket/retrylib/conf/orders.toml [--json]
#   submit.sh redrive s3://my-bucket/retrylib/conf/orders.toml [--dry-run] [filters]
#
# `status` and `redrive` (status-step.json, redrive-step.json) run that `retrylib` command
# once the same way, in a session of the cluster's Spark, which reads the job's tables (the
# node's Python has no pyspark of its own), and end the step with its exit code. They run
# beside the job only on a cluster created with a step concurrency above 1 (cluster.json).
#
# The config is deploy/emr/orders.toml, edited and copied to S3 (see deploy/README.md).
# `retrylib check --offline` reads it first: one that still holds a YOUR-... placeholder, or
# has any other problem, ends the step with exit code 2 and a line per problem naming its
# key, before any run.
#
# JVM parts: Delta Lake is the cluster's own (cluster.json's delta-defaults classification,
# delta.enabled, puts EMR's Delta jars on Spark's class path, the DynamoDB log store's
# among them), so no Delta is fetched here. Spark's Kafka connector is added with --packages
# only for a config with kafka.source = "builtin": the default source ("auto", on a new
# checkpoint retrylib's own "python" reader) needs none. A checkpoint started with
# "builtin" keeps that reader, so keep kafka.source = "builtin" in its config.
#
# Exit codes of a run (`retrylib run`): 0 done or stopped, 2 invalid config or a Spark older
# than 4.0: both end the step. Anything else (1 failed, a killed driver) is a failed run: it
# is started again after RETRYLIB_RESTART_DELAY seconds, up to RETRYLIB_MAX_RESTARTS times
# in a row; a run that lasted RETRYLIB_HEALTHY_AFTER seconds resets the count. The
# checkpoint makes every restart resume exactly once. SIGTERM or SIGINT (cancel-steps) is
# passed to the running spark-submit, which stops the query, and nothing is restarted.
#
# Settings (environment):
#   RETRYLIB_HOME           the repository on the primary node (/home/hadoop/retrylib)
#   PYSPARK_PYTHON          the interpreter (default: the one bootstrap.sh wrote to
#                           /etc/retrylib/python)
#   RETRYLIB_SPARK_EXTRA    more spark-submit flags, e.g. "--conf spark.executor.instances=4"
#   RETRYLIB_SPARK_JARS     more jars, comma-separated; RETRYLIB_SPARK_CONF: Spark settings,
#                           key=value pairs (docs/operating.md: extra jars and settings)
#   RETRYLIB_MAX_RESTARTS   failed runs started again in a row (10)
#   RETRYLIB_RESTART_DELAY  seconds between a failed run and the next (60)
#   RETRYLIB_HEALTHY_AFTER  seconds after which a run's failure starts the count anew (3600)
set -euo pipefail

tool=()
if [[ ${1:-} == status || ${1:-} == redrive ]]; then
  tool=("$1")
  shift
fi
config_uri=${1:?usage: submit.sh [status|redrive] s3://bucket/path/job.toml [OPTIONS]}
shift

home=${RETRYLIB_HOME:-/home/hadoop/retrylib}
etc=${RETRYLIB_ETC:-/etc/retrylib}
max_restarts=${RETRYLIB_MAX_RESTARTS:-10}
restart_delay=${RETRYLIB_RESTART_DELAY:-60}
healthy_after=${RETRYLIB_HEALTHY_AFTER:-3600}
# emr-spark-8.0.0 is Spark 4.0.2 on Scala 2.13: the connector must match the cluster's Spark.
kafka_connector=org.apache.spark:spark-sql-kafka-0-10_2.13:4.0.2

if [[ -z ${PYSPARK_PYTHON:-} ]]; then
  [[ -r $etc/python ]] || {
    echo "submit.sh: no PYSPARK_PYTHON and no $etc/python: run bootstrap.sh on the cluster" >&2
    exit 2
  }
  PYSPARK_PYTHON=$(<"$etc/python")
fi
export PYSPARK_PYTHON PYSPARK_DRIVER_PYTHON=$PYSPARK_PYTHON

conf_dir=$(mktemp -d)
config="$conf_dir/$(basename "$config_uri")"
aws s3 cp "$config_uri" "$config"
# The config as retrylib reads it: a placeholder left (YOUR-BUCKET, ...) or any other
# problem would fail only at the first write or connection, run after run.
"$PYSPARK_PYTHON" -m retrylib check --offline "$config" >&2 || exit $?
kafka_source=$("$PYSPARK_PYTHON" -c \
  'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["kafka"].get("source", ""))' \
  "$config")

submit=(spark-submit --master yarn --deploy-mode client)
if [[ $kafka_source == builtin ]]; then
  submit+=(--packages "$kafka_connector")
fi
submit+=(--conf spark.yarn.maxAppAttempts=1
  --conf "spark.pyspark.python=$PYSPARK_PYTHON"
  --conf "spark.pyspark.driver.python=$PYSPARK_PYTHON"
  --conf spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension
  --conf spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog)
# The user's jars and settings as spark-submit.sh takes them (retrylib/spark/extra.py): the
# jars of RETRYLIB_SPARK_JARS and of a --jars in RETRYLIB_SPARK_EXTRA as one --jars, a
# --conf per setting of RETRYLIB_SPARK_CONF, then RETRYLIB_SPARK_EXTRA's other flags.
for part in "" --rest; do
  printed=$("$PYSPARK_PYTHON" -m retrylib.spark.extra ${part:+"$part"}) || exit 2
  [[ -z $printed ]] || mapfile -t -O "${#submit[@]}" submit <<< "$printed"
done
submit+=("$home/jobs/run_job.py" "${tool[@]}" "$config" "$@")
# A command runs once: nothing to restart, its exit code is the step's.
if ((${#tool[@]})); then
  exec "${submit[@]}"
fi

child=
stopping=
interrupted=
forward() {
  stopping=1 interrupted=1
  [[ -n $child ]] && kill -TERM "$child" 2>/dev/null
  return 0
}
trap forward TERM INT

failures=0
while true; do
  started=$SECONDS
  "${submit[@]}" &
  child=$!
  # A trapped signal ends `wait` early (status > 128): wait again for the run's own status.
  while true; do
    interrupted= status=0
    wait "$child" || status=$?
    [[ -n $interrupted ]] && ((status > 128)) || break
  done
  child=
  if [[ -n $stopping || $status -eq 0 || $status -eq 2 ]]; then
    exit "$status"
  fi
  if ((SECONDS - started >= healthy_after)); then
    failures=0
  fi
  failures=$((failures + 1))
  if ((failures > max_restarts)); then
    echo "submit.sh: run failed (exit $status) $failures times in a row; giving up" >&2
    exit "$status"
  fi
  echo "submit.sh: run failed (exit $status); restart $failures of $max_restarts" \
    "in ${restart_delay}s" >&2
  sleep "$restart_delay" &
  child=$!
  wait "$child" || true
  child=
  [[ -z $stopping ]] || exit "$status"
done
