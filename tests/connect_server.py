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
import socket
import subprocess
import sys
import time
from pathlib import Path

from retrylib.kafka.broker import free_port
from retrylib.spark.jars import DELTA_SQL_CONF, spark_jars

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
                self.command(), stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self._workdir
            )
        deadline = time.monotonic() + timeout
        while not self._answers():
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the Spark Connect server did not start: see {self.log_path}")
            time.sleep(0.2)
        return self

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
        except OSError:
            return False

    def kill(self) -> None:
        """End the server at once (SIGKILL), as a machine's crash would: its Python workers
        go with it when their connection to it closes."""
        assert self._process is not None
        self._process.kill()
        self._process.wait()

    def stop(self) -> None:
        if self._process is None or self._process.poll() is not None:
            return
        self._process.terminate()
        try:
            self._process.wait(30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
