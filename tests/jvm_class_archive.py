"""A class-data-sharing archive of the Spark driver JVM's classes, made once per virtualenv
and Java build, for every Spark JVM the integration tests start through spark-submit (the
tests' session, each `retrylib` and spark-submit.sh process, the Spark Connect servers).

Such a JVM loads and verifies some fifteen thousand classes from Spark's jars before its
first job. Mapped from an archive (JDK's AppCDS, `-XX:SharedArchiveFile`), they cost a
fraction of that: on two cores a session started in 9-10 s instead of 15-23 s, and its first
job took 3-6 s instead of 7-10 s (four interleaved starts, a loaded machine).

The archive is written by a JVM that ran a small Delta and streaming workload and then
exited (`-XX:ArchiveClassesAtExit`). It matches only the class path it was made with (this
virtualenv's `pyspark/jars`); a JVM on another class path, or on another Java build, runs as
if there were none, and `-Xlog:cds*=off` keeps it from saying so on its stdout.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pyspark

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
    makes it under a lock, and the others wait for it and then map it.
    """
    archive = _archive_path()
    if not archive.exists():
        with _locked(archive.with_suffix(".lock")):
            if not archive.exists():
                _make_archive(archive, jvm_options)
    return f"{jvm_options} -XX:SharedArchiveFile={archive} -Xlog:cds*=off"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path` (made if missing) while the block runs."""
    with path.open("a") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        yield  # closing the file lets the lock go


def _archive_path() -> Path:
    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr
    build = hashlib.sha256(java.encode()).hexdigest()[:12]
    return Path(sys.prefix) / f"spark-{pyspark.__version__}-java-{build}.jsa"


def _make_archive(archive: Path, jvm_options: str) -> None:
    """Run the workload in a JVM that writes its loaded classes to `archive` as it exits;
    written beside it first, so a JVM never maps a half-written one."""
    partial = archive.with_suffix(f".{os.getpid()}.partial")
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_SUBMIT_OPTS": f"{jvm_options} -XX:ArchiveClassesAtExit={partial} -Xlog:cds*=off",
    }
    with tempfile.TemporaryDirectory() as folder:
        # Waits for the JVM too: it holds the pipes until it has written the archive.
        done = subprocess.run(
            [sys.executable, "-c", _WORKLOAD, folder],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    if done.returncode != 0 or not partial.exists():
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"the class archive's workload failed:\n{done.stderr[-3000:]}")
    os.replace(partial, archive)
