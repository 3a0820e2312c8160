"""A real HDFS for the tests: Hadoop's MiniDFSCluster (one NameNode, one DataNode) in a JVM of
its own, at the Hadoop version of the installed pyspark's client.

Test machinery only, so it lives here and not in the wheel: its jars are a set of the project's
resolver (`retrylib.dev.jars.resolve`, cached like the others), `hadoop-client-minicluster`
at the version of pyspark's own `hadoop-client-api` jar with the JUnit API its test classes
link against, minus every artifact pyspark ships; pyspark's jars complete the class path (its
`hadoop-client-api` and `hadoop-client-runtime` are the client the minicluster is built on).
`setup.sh` runs this file to resolve them with the other sets: `python tests/hdfs_cluster.py`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

from helpers import JVM_OPTIONS, port_answers, start_server, stop_group

from retrylib.dev.broker import free_port
from retrylib.dev.jars import hadoop_version, pyspark_jars, resolve, shipped_artifacts
from retrylib.errors import JarsError

JUNIT_VERSION = "5.13.3"
"""JUnit Jupiter's API, which MiniDFSCluster's test utilities call: the version Hadoop 3.5.0
builds with; Hadoop 3.4 (pyspark 4.0's) builds with 5.8.2, whose API this one keeps."""
OPENTEST4J_VERSION = "1.3.0"
_MANAGER_CLASS = "org.apache.hadoop.test.MiniDFSClusterManager"
WARN_TO_STDOUT = """\
rootLogger.level = warn
rootLogger.appenderRef.stdout.ref = stdout
appender.stdout.type = Console
appender.stdout.name = stdout
appender.stdout.layout.type = PatternLayout
appender.stdout.layout.pattern = %d{HH:mm:ss.SSS} %p %c{1}: %m%n
"""
"""A log4j2 configuration: warnings and errors to stdout, one line each."""
_LOG_CONFIG = (
    WARN_TO_STDOUT
    + """\
logger.manager.name = org.apache.hadoop.test.MiniDFSClusterManager
logger.manager.level = info
logger.cluster.name = org.apache.hadoop.hdfs.MiniDFSCluster
logger.cluster.level = info
appender.audit.type = File
appender.audit.name = audit
appender.audit.fileName = {audit_log}
appender.audit.layout.type = PatternLayout
appender.audit.layout.pattern = %m%n
logger.audit.name = org.apache.hadoop.hdfs.server.namenode.FSNamesystem.audit
logger.audit.level = info
logger.audit.additivity = false
logger.audit.appenderRef.audit.ref = audit
"""
)
# The name node's audit log: a line per call, as "... cmd=create\tsrc=/a/b\tdst=null ...".
_AUDIT_CREATE = re.compile(r"\tcmd=create\tsrc=(\S+)\t")


def hdfs_coordinates(version: str) -> list[str]:
    return [
        f"org.apache.hadoop:hadoop-client-minicluster:{version}",
        f"org.junit.jupiter:junit-jupiter-api:{JUNIT_VERSION}",
        f"org.opentest4j:opentest4j:{OPENTEST4J_VERSION}",
    ]


def hdfs_jars() -> list[Path]:
    """The minicluster's jars for the installed pyspark, resolved once; pyspark's own are not
    among them. Raises `JarsError` as `resolve`."""
    shipped = pyspark_jars()
    exclude = shipped_artifacts(shipped)
    return resolve("hdfs-tests", hdfs_coordinates(hadoop_version(shipped)), exclude)


class HdfsCluster:
    """A MiniDFSCluster on 127.0.0.1, formatted afresh, its data and log under `workdir`;
    `uri` (`hdfs://127.0.0.1:<port>`) names its root.

    The NameNode's RPC port is drawn by `free_port`; its web and the DataNode's ports are
    any free ones (the cluster's choice). The JVM runs in a process group of its own, ended
    whole by `kill` and `stop`.
    """

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.uri = f"hdfs://127.0.0.1:{self.port}"
        self.log_path = workdir / "hdfs.log"
        self.audit_log = workdir / "audit.log"
        self._workdir = workdir
        self._details = workdir / "details.json"
        self._process: subprocess.Popen | None = None

    def command(self) -> list[str]:
        log_config = self._workdir / "log4j2.properties"
        log_config.write_text(_LOG_CONFIG.replace("{audit_log}", str(self.audit_log)))
        tmp = self._workdir / "tmp"
        tmp.mkdir(exist_ok=True)
        jars = hdfs_jars()
        classpath = [str(self._webapps(jars)), *map(str, jars), *map(str, pyspark_jars())]
        return [
            "java",
            *JVM_OPTIONS.split(),
            "-Xmx512m",  # the NameNode sizes its block and inode maps by the heap
            f"-Dlog4j2.configurationFile={log_config}",
            f"-Djava.io.tmpdir={tmp}",
            f"-Dtest.build.data={self._workdir / 'data'}",
            "-cp",
            os.pathsep.join(classpath),
            _MANAGER_CLASS,
            "-format",
            "-nnport",
            str(self.port),
            "-datanodes",
            "1",
            "-writeDetails",
            str(self._details),
        ]

    def _webapps(self, jars: list[Path]) -> Path:
        """A folder holding the minicluster's `webapps/`, to put first on the class path.

        The web servers of the NameNode and DataNode find their pages there and serve them
        in place; found in the jar, Jetty unpacks each into a temporary folder after reading
        through the whole 56 MB jar, 2-4 s of a start of 10-15 s here."""
        folder = self._workdir / "resources"
        (minicluster,) = (jar for jar in jars if jar.name.startswith("hadoop-client-minicluster"))
        with zipfile.ZipFile(minicluster) as archive:
            members = [name for name in archive.namelist() if name.startswith("webapps/")]
            archive.extractall(folder, members)
        return folder

    def start(self, timeout: float = 120) -> HdfsCluster:
        """Start the cluster and wait until it serves. Raises `RuntimeError` with the log's
        tail when the JVM ends first or `timeout` seconds pass."""
        self._process = start_server(
            self.command(),
            self.log_path,
            lambda: self._written() and port_answers(self.port),
            "the test HDFS",
            cwd=self._workdir,
            timeout=timeout,
        )
        return self

    def _written(self) -> bool:
        """Whether the cluster wrote its details, which it does once its DataNode is up."""
        try:
            return json.loads(self._details.read_text()).get("namenode_port") == self.port
        except (OSError, ValueError):
            return False

    def created_files(self, prefix: str) -> list[str]:
        """The paths of the files created so far whose path starts with `prefix`, in order
        (from the name node's audit log)."""
        text = self.audit_log.read_text() if self.audit_log.exists() else ""
        return [path for path in _AUDIT_CREATE.findall(text) if path.startswith(prefix)]

    def stop(self) -> None:
        stop_group(self._process)


if __name__ == "__main__":
    try:
        print(f"hdfs (tests): {len(hdfs_jars())} jars")
    except JarsError as error:
        print(f"retrylib: {error}", file=sys.stderr)
        sys.exit(1)
