#!/usr/bin/env bash
# EMR step (see step.json): fetch the job's config and run it with ../../spark-submit.sh on
# YARN, the driver on the primary node (client mode), with Spark's Kafka connector and the
# Delta jars as --packages.
#
#   submit.sh s3://my-bucket/retrylib/conf/orders.toml [--available-now]
#
# Settings (environment):
#   RETRYLIB_HOME         the repository on the primary node (/home/hadoop/retrylib)
#   PYSPARK_PYTHON        the interpreter bootstrap.sh installed into (python3)
#   RETRYLIB_SPARK_EXTRA  more spark-submit flags, e.g. "--conf spark.executor.instances=4"
set -euo pipefail

config_uri=${1:?usage: submit.sh s3://bucket/path/job.toml [--available-now]}
shift

home=${RETRYLIB_HOME:-/home/hadoop/retrylib}
# emr-spark-8.0.0: Spark 4.0.2, Scala 2.13, Delta 4.0.0 (versions must match the cluster's)
packages=org.apache.spark:spark-sql-kafka-0-10_2.13:4.0.2,io.delta:delta-spark_2.13:4.0.0

conf_dir=$(mktemp -d)
config="$conf_dir/$(basename "$config_uri")"
aws s3 cp "$config_uri" "$config"

export PYSPARK_PYTHON=${PYSPARK_PYTHON:-python3}
export PYSPARK_DRIVER_PYTHON=${PYSPARK_DRIVER_PYTHON:-$PYSPARK_PYTHON}
export SPARK_SUBMIT_OPTS_EXTRA="--master yarn --deploy-mode client --packages $packages \
--conf spark.yarn.maxAppAttempts=1 \
--conf spark.executorEnv.PYSPARK_PYTHON=$PYSPARK_PYTHON \
--conf spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension \
--conf spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog \
${RETRYLIB_SPARK_EXTRA:-}"

exec "$home/spark-submit.sh" "$config" "$@"
