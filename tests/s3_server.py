"""A local S3-compatible server for the tests: moto's server (PyPI `moto[server]`) in a process
of its own, serving S3 and DynamoDB on 127.0.0.1, with one bucket made at start.

Spark reaches it through Hadoop's S3A (`s3a://<bucket>/...`, the `s3` set of
`retrylib.dev.jars`) with the settings `spark_conf` returns: its endpoint, path-style access
(moto serves buckets under the path, not as host names) and dummy keys. A job gets them as a
user gives any job extra jars and settings: `RETRYLIB_SPARK_JARS` and `RETRYLIB_SPARK_CONF`
(`job_env`).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from helpers import port_answers, stop_group

from retrylib.dev.broker import free_port
from retrylib.dev.jars import s3_jars

REGION = "us-east-1"
ACCESS_KEY = SECRET_KEY = "testing"  # moto takes any keys
_KEYS_PROVIDER = "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"  # fs.s3a.*.key


class S3Server:
    """moto's server on 127.0.0.1 (`endpoint`), its log in `log_path`; `bucket` is made at
    start. Runs in a process group of its own, ended whole by `stop`."""

    def __init__(self, workdir: Path, bucket: str = "retrylib-tests") -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.bucket = bucket
        self.log_path = workdir / "moto.log"
        self._process: subprocess.Popen | None = None

    @property
    def root(self) -> str:
        """The bucket's root as Spark names it: `s3a://<bucket>`."""
        return f"s3a://{self.bucket}"

    def hadoop_conf(self) -> dict[str, str]:
        """The Hadoop settings S3A needs to reach this server."""
        return {
            "fs.s3a.endpoint": self.endpoint,
            "fs.s3a.endpoint.region": REGION,
            "fs.s3a.path.style.access": "true",
            "fs.s3a.connection.ssl.enabled": "false",
            "fs.s3a.aws.credentials.provider": _KEYS_PROVIDER,
            "fs.s3a.access.key": ACCESS_KEY,
            "fs.s3a.secret.key": SECRET_KEY,
        }

    def spark_conf(self) -> dict[str, str]:
        """`hadoop_conf` as Spark settings (`spark.hadoop.<key>`)."""
        return {f"spark.hadoop.{key}": value for key, value in self.hadoop_conf().items()}

    def job_env(self) -> dict[str, str]:
        """The environment that gives a job S3A's jars and these settings, as a user gives
        them (`retrylib/spark/extra.py`)."""
        return {
            "RETRYLIB_SPARK_JARS": ",".join(str(jar) for jar in s3_jars()),
            "RETRYLIB_SPARK_CONF": " ".join(f"{k}={v}" for k, v in self.spark_conf().items()),
        }

    def client(self, service: str = "s3"):
        """A boto3 client of this server."""
        import boto3

        return boto3.client(
            service,
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
        )

    def start(self, timeout: float = 60) -> S3Server:
        """Start the server, wait until it answers and make the bucket. Raises `RuntimeError`
        with the log's tail when it ends first or `timeout` seconds pass."""
        command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while not port_answers(self.port):
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = self.log_path.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"the test S3 server did not start: see {self.log_path}\n{tail}")
            time.sleep(0.2)
        self.client().create_bucket(Bucket=self.bucket)
        return self

    def stop(self) -> None:
        stop_group(self._process)
