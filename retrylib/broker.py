"""An embedded Kafka-protocol broker (noida-db) for the demo and the tests.

noida-db is a single binary that speaks the Kafka protocol; it is installed from PyPI with
the `embedded` extra. It stops cleanly on SIGINT, not SIGTERM.
"""

from __future__ import annotations

import logging
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from retrylib.errors import RetrylibError

log = logging.getLogger(__name__)


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _noida_binary() -> str:
    """The noida-db executable inside the package, not its `noida-db` wrapper script.

    The wrapper answers SIGINT by SIGKILLing the broker, which then loses what it has not
    saved yet; `stop()` must signal the broker itself for a clean restart.
    """
    try:
        from importlib.resources import files

        binary = files("noida_db").joinpath("noida-db")
    except ImportError as e:
        raise RetrylibError(
            "the embedded broker needs noida-db: pip install 'retrylib[embedded]'"
        ) from e
    if not binary.is_file():
        raise RetrylibError(f"noida-db is installed but its binary is missing at {binary}")
    return str(binary)


class EmbeddedBroker:
    """A noida-db process listening on `host:port`, data in `data_dir` (a temp dir by default).

    Use as a context manager, or call `start()` and `stop()`. `start()` waits until the port
    answers and raises `RetrylibError` with the broker's output if it does not within `timeout`.
    """

    def __init__(
        self, data_dir: str | Path | None = None, host: str = "127.0.0.1", port: int | None = None
    ) -> None:
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="retrylib-broker-"))
        self.host = host
        self.port = port or _free_port(host)
        self._process: subprocess.Popen[bytes] | None = None
        self._log_path = self.data_dir / "broker.log"

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout: float = 20.0) -> EmbeddedBroker:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        command = [
            _noida_binary(),
            "start",
            "--data-dir",
            str(self.data_dir / "data"),
            "--host",
            self.host,
            "--only",
            "kafka",
            "--kafka-port",
            str(self.port),
        ]
        with open(self._log_path, "ab") as out:
            self._process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                break
            try:
                with socket.create_connection((self.host, self.port), timeout=0.5):
                    log.info("embedded broker ready at %s", self.bootstrap_servers)
                    return self
            except OSError:
                time.sleep(0.1)
        output = self._log_path.read_text(errors="replace")[-2000:]
        self.stop()
        raise RetrylibError(f"embedded broker did not start on {self.bootstrap_servers}: {output}")

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the broker (SIGINT, then SIGKILL after `timeout`); keeps data for a restart."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
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
