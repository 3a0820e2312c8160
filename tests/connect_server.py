"""A local Spark Connect server from the installed pyspark, with Spark's Kafka connector and
Delta Lake, for the tests that run retrylib as a Spark Connect client (`SPARK_REMOTE`).

It is what `sbin/start-connect-server.sh` runs (`spark-submit --class
org.apache.spark.sql.connect.service.SparkConnectServer`); pip's pyspark ships the server's
jar but not that script. The server's Python workers (foreachBatch, the Python data
sources, the handler's tasks) run on this interpreter, as a cluster's would run on the
Python retrylib is installed in.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from helpers import kill_group, port_answers, stop_group

from retrylib.dev.broker import free_port
from retrylib.dev.jars import DELTA_SQL_CONF, spark_jars

_SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


class ConnectServer:
    """A Spark Connect server on `local[2]`, its log in `log_path`; `url` is the
    `SPARK_REMOTE` of its clients."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.url = f"sc://127.0.0.1:{self.port}"
        self.log_path = workdir / "connect-server.log"
        self._workdir = workdir
        self._process: subprocess.Popen | None = None

    def command(self) -> list[str]:
        import pyspark

        settings = {
            **DELTA_SQL_CONF,
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.pyspark.python": sys.executable,
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.databricks.delta.snapshotPartitions": "2",
            "spark.sql.warehouse.dir": str(self._workdir / "warehouse"),
        }
        command = [
            str(Path(pyspark.__file__).parent / "bin" / "spark-submit"),
            "--class",
            _SERVER_CLASS,
            "--master",
            "local[2]",
            "--jars",
            ",".join(str(jar) for jar in spark_jars()),
        ]
        for key, value in settings.items():
            command += ["--conf", f"{key}={value}"]
        return command

    def start(self, timeout: float = 120) -> ConnectServer:
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
        env.pop("SPARK_REMOTE", None)
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self._workdir,
                start_new_session=True,  # a process group of its own, with its Python workers
            )
        deadline = time.monotonic() + timeout
        while not port_answers(self.port):
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the Spark Connect server did not start: see {self.log_path}")
            time.sleep(0.2)
        return self

    def kill(self) -> None:
        """End the server at once, as a machine's crash would: SIGKILL to its process group.

        The group holds the Python workers the server started. Its foreachBatch worker, a
        Spark Connect client of the server, outlived a JVM killed alone: orphaned, it dialed
        the dead server's port twice a second for as long as it lived (past the test run),
        and when a Spark JVM of another test listened on that port for its own Python worker
        to connect back, that JVM read the dial as a wrong secret and failed its query
        ("Python worker failed to connect back": "Authentication failed").
        """
        assert self._process is not None
        kill_group(self._process)
        self._process.wait()

    def stop(self) -> None:
        stop_group(self._process)  # and any Python worker the JVM left behind
