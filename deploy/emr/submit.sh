#!/usr/bin/env bash
# EMR step (see step.json): fetch the job's config and run jobs/run_job.py with the
# cluster's spark-submit on YARN, the driver on the primary node (client mode), Spark's
# Kafka connector and the Delta jars as --packages, and the Python that bootstrap.sh
# installed into as PYSPARK_PYTHON.
#
#   submit.sh s3://my-bucket/retrylib/conf/orders.toml [--available-now]
#
# Settings (environment):
#   RETRYLIB_HOME           the repository on the primary node (/home/hadoop/retrylib)
#   PYSPARK_PYTHON          the interpreter (default: the one bootstrap.sh wrote to
#                           /etc/retrylib/python)
#   RETRYLIB_SPARK_EXTRA    more spark-submit flags, e.g. "--conf spark.executor.instances=4"
set -euo pipefail

config_uri=${1:?usage: submit.sh s3://bucket/path/job.toml [--available-now]}
shift

home=${RETRYLIB_HOME:-/home/hadoop/retrylib}
etc=${RETRYLIB_ETC:-/etc/retrylib}
# emr-spark-8.0.0: Spark 4.0.2, Scala 2.13, Delta 4.0.0 (versions must match the cluster's)
packages=org.apache.spark:spark-sql-kafka-0-10_2.13:4.0.2,io.delta:delta-spark_2.13:4.0.0

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

submit=(spark-submit --master yarn --deploy-mode client --packages "$packages"
  --conf spark.yarn.maxAppAttempts=1
  --conf "spark.pyspark.python=$PYSPARK_PYTHON"
  --conf "spark.pyspark.driver.python=$PYSPARK_PYTHON"
  --conf spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension
  --conf spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog)
# shellcheck disable=SC2206
submit+=(${RETRYLIB_SPARK_EXTRA:-} "$home/jobs/run_job.py" "$config" "$@")

exec "${submit[@]}"
