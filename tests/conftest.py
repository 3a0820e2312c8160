"""Session fixtures: one SparkSession and one Kafka broker for the whole run (a Spark Connect
server, an HDFS and an S3 for the tests that ask), and the Java options of every Spark JVM
the tests start.

The broker is, in order: an external cluster named by RETRYLIB_TEST_BOOTSTRAP_SERVERS;
testcontainers' Kafka where a Docker engine answers; else an embedded Apache Kafka broker
(`retrylib.dev.broker`).
"""

from __future__ import annotations

import logging
import os
import sys
import uuid
from collections.abc import Callable, Iterator

import pytest
from hdfs_cluster import HdfsCluster
from helpers import JVM_OPTIONS, REPO, build_tests_session, tests_session
from s3_server import S3Server

from retrylib.kafka.clients import ensure_topics, make_admin

# Every Spark JVM of the run (this session's, and those of the `retrylib` and spark-submit
# processes the tests start, which inherit the environment) runs with the tests' options.
os.environ.setdefault("SPARK_SUBMIT_OPTS", JVM_OPTIONS)
# The example handlers' project (examples/, built into a wheel on a cluster) imports here as
# if installed: the configs the tests load in this process name orders_handlers.handlers.
sys.path.insert(0, str(REPO / "examples"))


def _docker_answers() -> bool:
    try:
        import docker

        docker.from_env(timeout=2).ping()
        return True
    except Exception:
        return False


@pytest.fixture(scope="session")
def bootstrap_servers(request: pytest.FixtureRequest, tmp_path_factory) -> Iterator[str]:
    external = os.environ.get("RETRYLIB_TEST_BOOTSTRAP_SERVERS")
    if external:
        yield external
        return
    if _docker_answers():
        from testcontainers.kafka import KafkaContainer

        with KafkaContainer() as kafka:
            yield kafka.get_bootstrap_server()
        return
    from retrylib.dev.broker import EmbeddedBroker

    # Under pytest's base temp dir, which keeps the last runs: the log outlives the run.
    broker = EmbeddedBroker(data_dir=tmp_path_factory.mktemp("broker")).start()
    try:
        yield broker.bootstrap_servers
    finally:
        broker.stop()
        if request.session.testsfailed:
            print(f"\nembedded Kafka broker log: {broker.log_path}")


@pytest.fixture(scope="session")
def make_topic(bootstrap_servers: str) -> Callable[..., str]:
    """Create a fresh uuid-named topic; returns its name."""
    admin = make_admin(bootstrap_servers, {})

    def create(prefix: str = "t", partitions: int = 3) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        ensure_topics(admin, {name: partitions}, create=True)
        return name

    return create


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    session = build_tests_session(warehouse=tmp_path_factory.mktemp("warehouse"))
    yield session
    session.stop()


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory) -> Iterator[str]:
    """A local Spark Connect server for the whole run (started by the first test that asks
    for it); yields its `SPARK_REMOTE` URL."""
    from connect_server import ConnectServer

    server = ConnectServer(tmp_path_factory.mktemp("connect")).start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="session")
def hdfs(tmp_path_factory) -> Iterator[HdfsCluster]:
    """A real HDFS (Hadoop's MiniDFSCluster, one NameNode and one DataNode, in a JVM of its
    own; `tests/hdfs_cluster.py`) for the whole run; yields it (its root URI is `uri`,
    `hdfs://127.0.0.1:<port>`).

    Started by the first test that asks for it, in about 10 s. Each pytest-xdist worker that
    runs such a test starts its own (`--dist loadfile` keeps a file's tests on one worker):
    the HDFS tests are in one module, and the YARN tests (test_yarn.py) run on it as their
    default file system. Paths under it outlive a test; name them apart.
    """
    cluster = HdfsCluster(tmp_path_factory.mktemp("hdfs")).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def s3(tmp_path_factory) -> Iterator[S3Server]:
    """A local S3 (moto's server, `tests/s3_server.py`) with one bucket, for the whole run;
    yields it (`root` is `s3a://<bucket>`, `job_env()` what a job needs to reach it). The
    tests' session reaches it too. Started by the first test that asks for it, in a second
    or two, once per pytest-xdist worker (the S3 tests are in one module). Paths under it
    outlive a test; name them apart."""
    server = S3Server(tmp_path_factory.mktemp("s3")).start()
    hadoop = tests_session()._jsc.hadoopConfiguration()
    for key, value in server.hadoop_conf().items():
        hadoop.set(key, value)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def keep_root_logger() -> Iterator[None]:
    """Put the root logger's handlers and level back after a test that configures logging
    (as `retrylib` commands do)."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
