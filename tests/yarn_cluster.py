"""A real YARN cluster for the tests: Hadoop's MiniYARNCluster (one ResourceManager, one
NodeManager) in a JVM of its own, from the jars of the tests' HDFS (`hdfs_cluster.py`), with
an HDFS as its default file system, as on EMR.

hadoop-client-minicluster's own launcher starts YARN only as a MapReduce cluster, whose
classes that jar leaves out, so the JVM runs `MiniYarnClusterMain.java` beside this file
(Java runs a one-file program from source). Its ResourceManager needs Bouncy Castle, which
the jar leaves out too: a set of the project's resolver of its own (`yarn_jars`).
`setup.sh` runs this file to resolve it with the other sets: `python tests/yarn_cluster.py`.

Containers run on this machine as the NodeManager's own processes (bash, then the JVM it
launches with `$JAVA_HOME/bin/java`), each in a session of its own (`setsid`) but for the
shell that starts it, in a folder under the NodeManager's local folder, which is under the
cluster's work dir: that folder is how `container_processes` finds them, and how `stop` ends
every one that is left.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import xml.etree.ElementTree as ElementTree
from pathlib import Path

from hdfs_cluster import WARN_TO_STDOUT, hdfs_jars
from helpers import JVM_OPTIONS, start_server, stop_group

from retrylib.dev.broker import free_port
from retrylib.dev.jars import pyspark_jars, resolve
from retrylib.errors import JarsError

BOUNCYCASTLE_VERSION = "1.82"
"""The version Hadoop 3.5.0 builds with (3.4.2 with 1.78.1, whose API it keeps)."""
_LAUNCHER = Path(__file__).with_name("MiniYarnClusterMain.java")
_SETTINGS = {
    # The capacity scheduler wants a queue file and gives application masters 10 % of the
    # memory at most: the FIFO scheduler has neither.
    "yarn.resourcemanager.scheduler.class": (
        "org.apache.hadoop.yarn.server.resourcemanager.scheduler.fifo.FifoScheduler"
    ),
    "yarn.scheduler.minimum-allocation-mb": "128",
    # Spark's Python workers run beside the container's JVM, outside its heap: YARN's memory
    # checks would count them against the container and kill it.
    "yarn.nodemanager.vmem-check-enabled": "false",
    "yarn.nodemanager.pmem-check-enabled": "false",
    # A disk 90 % full would mark the node unhealthy and leave every container unscheduled.
    "yarn.nodemanager.disk-health-checker.enable": "false",
}
_ADDRESSES = (
    "yarn.resourcemanager.address",
    "yarn.resourcemanager.scheduler.address",
    "yarn.resourcemanager.resource-tracker.address",
    "yarn.resourcemanager.admin.address",
    "yarn.resourcemanager.webapp.address",
    "yarn.nodemanager.address",
    "yarn.nodemanager.localizer.address",
    "yarn.nodemanager.webapp.address",
)


def yarn_jars() -> list[Path]:
    """The minicluster's jars (`hdfs_jars`) and Bouncy Castle's, resolved once; pyspark's own
    are not among them. Raises `JarsError` as `resolve`."""
    bouncy_castle = [
        f"org.bouncycastle:{artifact}:{BOUNCYCASTLE_VERSION}"
        for artifact in ("bcprov-jdk18on", "bcpkix-jdk18on")
    ]
    return [*hdfs_jars(), *resolve("yarn-tests", bouncy_castle)]


def java_home() -> str:
    """JAVA_HOME, else the home of the `java` on PATH: the NodeManager hands it to the
    containers, which start `$JAVA_HOME/bin/java`."""
    found = os.environ.get("JAVA_HOME") or shutil.which("java")
    if found is None:
        raise RuntimeError("no JAVA_HOME and no java on PATH")
    path = Path(found).resolve()
    return str(path.parents[1] if path.name == "java" else path)


class YarnCluster:
    """A MiniYARNCluster on this host whose default file system is `default_fs` (an HDFS's
    `hdfs://127.0.0.1:<port>`), its NodeManager offering `memory_mb` to containers, its
    folders and log under `workdir`.

    Once started, `conf_dir` holds the `core-site.xml` and `yarn-site.xml` that a client
    needs (`HADOOP_CONF_DIR`, `YARN_CONF_DIR`). The JVM runs in a process group of its own;
    `stop` ends it and every container process left.
    """

    def __init__(self, workdir: Path, default_fs: str, memory_mb: int = 4096) -> None:
        self.workdir = workdir
        self.default_fs = default_fs
        self.memory_mb = memory_mb
        self.conf_dir = workdir / "conf"
        self.log_path = workdir / "yarn.log"
        self._written = workdir / "cluster-config.xml"
        self._process: subprocess.Popen | None = None
        self._config: dict[str, str] = {}
        self._container_logs = workdir

    def command(self) -> list[str]:
        log_config = self.workdir / "log4j2.properties"
        log_config.write_text(WARN_TO_STDOUT)
        tmp = self.workdir / "tmp"
        tmp.mkdir(exist_ok=True)
        # Every server of the cluster on a port drawn by `free_port`, out of the ephemeral
        # range that its clients' own sockets draw from (`free_port` says why).
        addresses = {key: f"127.0.0.1:{free_port()}" for key in _ADDRESSES}
        settings = {
            **_SETTINGS,
            **addresses,
            "yarn.minicluster.fixed.ports": "true",  # else it binds each to port 0
            "fs.defaultFS": self.default_fs,
            "hadoop.tmp.dir": str(tmp),
            "yarn.nodemanager.resource.memory-mb": str(self.memory_mb),
        }
        classpath = [*map(str, yarn_jars()), *map(str, pyspark_jars())]
        return [
            "java",
            *JVM_OPTIONS.split(),
            "-Xmx512m",
            f"-Dlog4j2.configurationFile={log_config}",
            f"-Djava.io.tmpdir={tmp}",
            "-cp",
            os.pathsep.join(classpath),
            str(_LAUNCHER),
            str(self._written),
            *(f"{key}={value}" for key, value in settings.items()),
        ]

    def start(self, timeout: float = 180) -> YarnCluster:
        """Start the cluster, wait until its NodeManager has registered and write `conf_dir`.
        Raises `RuntimeError` with the log's tail when the JVM ends first or `timeout`
        seconds pass."""
        self._process = start_server(
            self.command(),
            self.log_path,
            self._written.exists,
            "the test YARN",
            cwd=self.workdir,  # the cluster's folders: ./target/test/data/retrylib
            env={**os.environ, "JAVA_HOME": java_home()},
            timeout=timeout,
        )
        # Found once: a walk of the whole tree would race the containers' folders coming
        # and going.
        [self._container_logs] = self.workdir.glob("target/test/data/retrylib/*/*-logDir-nm-*")
        root = ElementTree.parse(self._written).getroot()
        self._config = {
            prop.findtext("name"): prop.findtext("value") or "" for prop in root.iter("property")
        }
        self.conf_dir.mkdir(exist_ok=True)
        # Every setting the cluster runs with, as YARN's clients read them; the default file
        # system in core-site.xml, which every Hadoop client reads.
        shutil.copy(self._written, self.conf_dir / "yarn-site.xml")
        (self.conf_dir / "core-site.xml").write_text(
            "<configuration><property><name>fs.defaultFS</name>"
            f"<value>{self.default_fs}</value></property></configuration>\n"
        )
        return self

    @property
    def web_url(self) -> str:
        return f"http://{self._config['yarn.resourcemanager.webapp.address']}"

    def application(self, app_id: str) -> dict:
        """The ResourceManager's report on application `app_id` (REST: state, finalStatus,
        runningContainers, ...)."""
        return self._get(f"/ws/v1/cluster/apps/{app_id}")["app"]

    def attempts(self, app_id: str) -> list[dict]:
        """The ResourceManager's report on each attempt of application `app_id`, in order."""
        return self._get(f"/ws/v1/cluster/apps/{app_id}/appattempts")["appAttempts"]["appAttempt"]

    def _get(self, path: str) -> dict:
        with urllib.request.urlopen(f"{self.web_url}{path}", timeout=10) as response:
            return json.load(response)

    def container_logs(self, app_id: str) -> Path:
        """The folder of the logs of application `app_id`'s containers, one sub-folder each
        (`container_<cluster>_<app>_<attempt>_<n>/` with `stdout` and `stderr`), there from
        its first container's start on."""
        return self._container_logs / app_id

    def container_processes(self) -> dict[str, list[int]]:
        """The processes of the containers running now: container id -> pids (those whose
        working folder is a container's)."""
        found: dict[str, list[int]] = {}
        for pid, cwd in _working_folders().items():
            if self.workdir in cwd.parents and cwd.name.startswith("container_"):
                found.setdefault(cwd.name, []).append(pid)
        return found

    def container_jvm(self, container_id: str) -> int:
        """The pid of the JVM that container `container_id` runs (the shells that start it
        name its class too)."""
        [pid] = [
            pid
            for pid in self.container_processes()[container_id]
            if Path(f"/proc/{pid}/exe").resolve().name == "java"
        ]
        return pid

    def kill_container(self, container_id: str) -> list[int]:
        """SIGKILL every process of container `container_id` (its session, as a lost node
        ends it) and wait until none runs; returns their pids."""
        pids = self.container_processes().get(container_id, [])
        _kill_sessions(pids)
        deadline = time.monotonic() + 30
        while set(pids) & set(_working_folders()):
            assert time.monotonic() < deadline, f"container {container_id} still runs: {pids}"
            time.sleep(0.05)
        return pids

    def stop(self) -> None:
        stop_group(self._process)
        for pids in self.container_processes().values():
            _kill_sessions(pids)


def _working_folders() -> dict[int, Path]:
    """The working folder of each live process of this machine that this one may read."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                found[int(entry.name)] = (entry / "cwd").resolve(strict=True)
    return found


def _kill_sessions(pids: list[int]) -> None:
    """SIGKILL the process groups that processes among `pids` lead: a container's session
    (`setsid bash launch_container.sh` and all it starts). The shell that started it is in
    the NodeManager's group, which is not theirs to kill; it ends with the session."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            if os.getpgid(pid) == pid:
                os.killpg(pid, signal.SIGKILL)


if __name__ == "__main__":
    try:
        print(f"yarn (tests): {len(yarn_jars())} jars")
    except JarsError as error:
        print(f"retrylib: {error}", file=sys.stderr)
        sys.exit(1)
