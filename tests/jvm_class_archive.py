"""A class-data-sharing archive of the Spark driver JVM's classes, made once per virtualenv
and Java build, for every Spark JVM the integration tests start through spark-submit (the
tests' session, each `retrylib` and spark-submit.sh process, the Spark Connect servers).

Such a JVM loads and verifies some fifteen thousand classes from Spark's jars before its
first job. Mapped from an archive (JDK's AppCDS, `-XX:SharedArchiveFile`), they cost a
fraction of that: on two cores a session started in 9-10 s instead of 15-23 s, and its first
job took 3-6 s instead of 7-10 s (four interleaved starts, a loaded machine).

The archive is written by a JVM that ran a small Delta and streaming workload in the tests'
session and then exited (`-XX:ArchiveClassesAtExit`), made as spark-submit.sh's is
(`retrylib.dev.class_archive.make_archive`). It matches only the class path it was made with
(this virtualenv's `pyspark/jars`); a JVM on another class path, or on another Java build,
runs as if there were none, and the options `java_options` adds keep it from saying so
on its stdout.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pyspark

from retrylib.dev.class_archive import java_options, make_archive

_WORKLOAD = """
import sys
from retrylib.spark.session import build_spark_session

folder = sys.argv[1]
spark = build_spark_session(
    "class-archive", master="local[2]",
    extra={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"},
)
spark.range(10).write.format("delta").save(f"{folder}/table")
spark.read.format("delta").load(f"{folder}/table").mapInArrow(lambda b: b, "id LONG").count()
spark.range(3).write.json(f"{folder}/in")
query = (
    spark.readStream.schema("id LONG").json(f"{folder}/in").writeStream
    .foreachBatch(lambda frame, batch_id: frame.write.format("delta").mode("append")
                  .option("txnAppId", "class-archive").option("txnVersion", batch_id)
                  .save(f"{folder}/out"))
    .option("checkpointLocation", f"{folder}/checkpoint")
    .trigger(availableNow=True).start()
)
query.awaitTermination()
spark.stop()
"""


def archive_options(jvm_options: str) -> str:
    """`jvm_options` with this virtualenv's class archive, made first if there is none.

    Made once by the test processes of one run (pytest's workers): the first to find none
    makes it (`make_archive`, under its lock), and the others wait for that lock and then
    map it.
    """
    archive = _archive_path()
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_SUBMIT_OPTS": jvm_options}
    if not archive.exists() and not make_archive(archive, [sys.executable], env, _WORKLOAD):
        with open(archive.with_name(f"{archive.name}.lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # until the maker that held it is done
        if not archive.exists():
            failed = archive.with_name(f"{archive.name}.failed")
            why = failed.read_text()[-3000:] if failed.exists() else "(no .failed file)"
            raise RuntimeError(f"the class archive's workload failed:\n{why}")
    return java_options(archive, jvm_options)


def _archive_path() -> Path:
    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr
    build = hashlib.sha256(java.encode()).hexdigest()[:12]
    return Path(sys.prefix) / f"spark-{pyspark.__version__}-java-{build}.jsa"
