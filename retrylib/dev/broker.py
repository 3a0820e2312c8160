"""An embedded Apache Kafka broker for the demo and the tests: one KRaft node from its jars.

The jars come from `retrylib.dev.jars.kafka_jars` (Maven, fetched once). The node is broker and
controller at once, with replication factors of 1, listening on free loopback ports. Its
data survives `stop()`, so a test can restart it on the same ports; its log is
`<data_dir>/broker.log`.
"""

from __future__ import annotations

import base64
import ipaddress
import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

from retrylib.dev.jars import KAFKA_VERSION, kafka_jars
from retrylib.errors import RetrylibError

log = logging.getLogger(__name__)

_LOG4J = """\
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
appender.file.type = File
appender.file.name = file
appender.file.fileName = {path}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
logger.kafka.name = kafka
logger.kafka.level = WARN
logger.apache.name = org.apache.kafka
logger.apache.level = WARN
"""
# Broker-side settings a one-node cluster needs (internal topics would otherwise wait for
# three replicas), plus no waiting before the first consumer group rebalance.
_SINGLE_NODE = {
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "3",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "3",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
    "num.partitions": "1",
}
_SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
_KEYSTORE_PASSWORD = "embedded-broker"  # guards nothing: a throwaway test key
_JVM_OPTIONS = ["-Xms256m", "-Xmx1g", "-XX:+UseG1GC", "-Djava.awt.headless=true"]


# Where servers' ports are drawn from: below the kernel's ephemeral ports (Linux 32768-60999,
# macOS 49152-65535), which it hands to bind(0) and to outgoing connections.
_SERVER_PORTS = range(10_000, 32_768)
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port no one listens on at `host` now, outside the kernel's ephemeral ports.

    A port from that range can be handed to another process between this check and the
    server's bind. And a client still dialing a server that stopped (a Kafka client during a
    broker's outage, an orphaned Spark Connect client) reaches whatever listens on that port
    next: a Spark JVM waiting there for its Python worker to connect back took such a dial for
    a wrong secret and failed its query.
    """
    ports = server_ports(_ephemeral_ports())
    chooser = random.SystemRandom()
    for _ in range(50):
        port = chooser.choice(ports) if ports else 0
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return sock.getsockname()[1]
    raise RetrylibError(f"no free TCP port at {host} in {ports}")


def server_ports(ephemeral: range | None) -> range:
    """`_SERVER_PORTS` less the ephemeral ports this machine set (`ephemeral`, when known):
    those below the range's start, or none (then any free port will do)."""
    if ephemeral is None or ephemeral.start >= _SERVER_PORTS.stop:
        return _SERVER_PORTS
    return range(_SERVER_PORTS.start, max(_SERVER_PORTS.start, ephemeral.start))


def _ephemeral_ports() -> range | None:
    """The ephemeral ports Linux hands out, from /proc; None elsewhere."""
    try:
        low, high = map(int, _EPHEMERAL_RANGE.read_text().split())
    except (OSError, ValueError):
        return None
    return range(low, high + 1)


def _san(host: str) -> str:
    """`host` as a certificate's subject alternative name, for keytool."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return f"dns:{host}"
    return f"ip:{host}"


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not java or not Path(java).exists():
        raise RetrylibError("the embedded Kafka broker needs Java 17+: java not found")
    return java


class EmbeddedBroker:
    """An Apache Kafka KRaft node on `host:port`, data in `data_dir` (a temp dir by default).

    Use as a context manager, or call `start()` and `stop()`. `start()` formats the storage
    on first use and waits until the broker answers a metadata request; it raises
    `RetrylibError` with the tail of the broker's log when it does not within `timeout`.
    """

    def __init__(
        self,
        data_dir: str | Path | None = None,
        host: str = "127.0.0.1",
        port: int | None = None,
        sasl_users: Mapping[str, str] | None = None,
    ) -> None:
        """`sasl_users` (name -> password), when given, open two more listeners where
        clients log in with SASL (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, or OAUTHBEARER with
        unsecured tokens): `sasl_bootstrap_servers` over plaintext, `sasl_ssl_bootstrap_servers`
        over TLS with a self-signed certificate for `host`, whose PEM is `ca_file`.
        """
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="retrylib-broker-"))
        self.host = host
        self.port = port or free_port(host)
        self.controller_port = free_port(host)
        self.sasl_users = dict(sasl_users or {})
        self.sasl_port = free_port(host) if self.sasl_users else None
        self.sasl_ssl_port = free_port(host) if self.sasl_users else None
        self.ca_file = self.data_dir / "ca.pem"
        self.log_path = self.data_dir / "broker.log"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def sasl_bootstrap_servers(self) -> str:
        if self.sasl_port is None:
            raise RetrylibError("this broker has no SASL listener: give it sasl_users")
        return f"{self.host}:{self.sasl_port}"

    @property
    def sasl_ssl_bootstrap_servers(self) -> str:
        if self.sasl_ssl_port is None:
            raise RetrylibError("this broker has no SASL listener: give it sasl_users")
        return f"{self.host}:{self.sasl_ssl_port}"

    def _write_config(self) -> Path:
        listeners = {"PLAINTEXT": self.port}
        if self.sasl_port is not None and self.sasl_ssl_port is not None:
            listeners["SASL_PLAINTEXT"] = self.sasl_port
            listeners["SASL_SSL"] = self.sasl_ssl_port
        served = ",".join(f"{name}://{self.host}:{port}" for name, port in listeners.items())
        settings = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@{self.host}:{self.controller_port}",
            "listeners": f"{served},CONTROLLER://{self.host}:{self.controller_port}",
            "advertised.listeners": served,
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": ",".join(
                [*(f"{name}:{name}" for name in listeners), "CONTROLLER:PLAINTEXT"]
            ),
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.data_dir / "data"),
            **_SINGLE_NODE,
            **self._sasl_settings(),
        }
        config = self.data_dir / "server.properties"
        config.write_text("".join(f"{key}={value}\n" for key, value in settings.items()))
        (self.data_dir / "log4j2.properties").write_text(_LOG4J.format(path=self.log_path))
        return config

    def _sasl_settings(self) -> dict[str, str]:
        """The SASL listeners' mechanisms, their broker-side logins, and the TLS key.

        PLAIN checks the users listed in its JAAS line; SCRAM checks the credentials
        written into the storage when it is formatted (`_format_storage`); OAUTHBEARER takes
        Kafka's unsecured tokens (no signature), which is only for tests.
        """
        if not self.sasl_users:
            return {}
        users = " ".join(f'user_{name}="{password}"' for name, password in self.sasl_users.items())
        scram = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        logins = {
            "plain": f"org.apache.kafka.common.security.plain.PlainLoginModule required {users};",
            "scram-sha-256": scram,
            "scram-sha-512": scram,
            "oauthbearer": (
                "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
                'unsecuredLoginStringClaim_sub="broker";'
            ),
        }
        return {
            "sasl.enabled.mechanisms": ",".join(_SASL_MECHANISMS),
            **{
                f"listener.name.{listener}.{mechanism}.sasl.jaas.config": login
                for listener in ("sasl_plaintext", "sasl_ssl")
                for mechanism, login in logins.items()
            },
            "ssl.keystore.type": "PKCS12",
            "ssl.keystore.location": str(self._keystore),
            "ssl.keystore.password": _KEYSTORE_PASSWORD,
        }

    @property
    def _keystore(self) -> Path:
        return self.data_dir / "broker.p12"

    def _write_certificate(self) -> None:
        """A self-signed key and certificate for `host` (keytool, from the JDK), and the
        certificate as PEM (`ca_file`) for clients to trust."""
        if self._keystore.exists():
            return
        keytool = str(Path(_java()).with_name("keytool"))
        store = ["-keystore", str(self._keystore), "-storepass", _KEYSTORE_PASSWORD]
        for command in (
            [
                "-genkeypair", "-alias", "broker", "-keyalg", "RSA", "-keysize", "2048",
                "-validity", "3650", "-dname", f"CN={self.host}",
                "-ext", f"SAN={_san(self.host)},dns:localhost", "-storetype", "PKCS12",
            ],
            ["-exportcert", "-alias", "broker", "-rfc", "-file", str(self.ca_file)],
        ):  # fmt: skip
            done = subprocess.run([keytool, *command, *store], capture_output=True, text=True)
            if done.returncode != 0:
                raise RetrylibError(f"keytool failed: {done.stdout}{done.stderr}")

    def _java_command(self, main_class: str, *args: str) -> list[str]:
        classpath = os.pathsep.join(str(jar) for jar in kafka_jars())
        return [
            _java(),
            *_JVM_OPTIONS,
            f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.properties'}",
            "-cp",
            classpath,
            main_class,
            *args,
        ]

    def _format_storage(self, config: Path) -> None:
        if (self.data_dir / "data" / "meta.properties").exists():
            return
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        # "--cluster-id=" keeps an id that starts with "-" (1 in 64) from reading as an option.
        scram = [
            f"--add-scram={mechanism}=[name={name},password={password}]"
            for name, password in self.sasl_users.items()
            for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512")
        ]
        command = self._java_command(
            "kafka.tools.StorageTool",
            "format",
            f"--cluster-id={cluster_id}",
            "-c",
            str(config),
            *scram,
        )
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise RetrylibError(
                f"formatting the embedded Kafka broker's storage failed: {done.stdout}{done.stderr}"
            )

    def start(self, timeout: float = 60.0) -> EmbeddedBroker:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        config = self._write_config()
        if self.sasl_users:
            self._write_certificate()
        self._format_storage(config)
        with open(self.data_dir / "broker.out", "ab") as out:
            self._process = subprocess.Popen(
                self._java_command("kafka.Kafka", str(config)),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self._process.poll() is None:
            if self._answers():
                log.info(
                    "embedded Apache Kafka %s ready at %s", KAFKA_VERSION, self.bootstrap_servers
                )
                return self
            time.sleep(0.2)
        tail = self.log_tail()
        self.stop()
        raise RetrylibError(
            f"embedded Kafka broker did not start on {self.bootstrap_servers}: {tail}"
        )

    def _answers(self) -> bool:
        """True once the broker serves metadata (the port opens before it does)."""
        try:
            with socket.create_connection((self.host, self.port), timeout=0.5):
                pass
        except OSError:
            return False
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers, "log_level": 0})
        try:
            return bool(admin.list_topics(timeout=2).brokers)
        except Exception:
            return False

    def log_tail(self, characters: int = 3000) -> str:
        """The end of the broker's log and console output, for error messages."""
        texts = [
            path.read_text(errors="replace")[-characters:]
            for path in (self.log_path, self.data_dir / "broker.out")
            if path.exists()
        ]
        return "\n".join(texts)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the broker (SIGTERM: a controlled shutdown; SIGKILL after `timeout`).

        Keeps its data and ports for a restart.
        """
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def kill(self) -> None:
        """Kill the broker at once (SIGKILL), as a crash would; keeps its data."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()

    def close(self) -> None:
        """Stop the broker and remove its data if the data directory was a temp dir."""
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
