"""Stop requests for a running job: SIGTERM or SIGINT to the Python driver, or to the JVM
that spark-submit started.

Under `spark-submit`, the JVM (`SparkSubmit`, or YARN's `ApplicationMaster`) is the parent:
Spark's `PythonRunner` starts the Python driver as a child process, waits for it and exits
with its exit code. A cluster manager (Kubernetes, YARN, a shell's `kill`) signals that
JVM, never the child. Spark 4.2 installs no handler of its own in that JVM (only executors
and daemons log signals through `SignalUtils`), so SIGTERM takes the JVM's default path:
its shutdown hooks stop the SparkContext, the running batch dies with it, and the process
exits 143 while the Python driver loses its gateway.

So the driver installs a JVM signal handler (`sun.misc.Signal`) written in Python, called
back over Py4J's callback server: the first SIGTERM or SIGINT to the JVM sets the same stop
request as a signal to this process, the job stops its query once the running batch is
done, returns 0, and `PythonRunner` then ends the JVM with that 0. The handler puts the
JVM's own handler back before anything else, so a second signal of the same kind ends the
JVM at once, as before.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from pyspark.sql import SparkSession

from retrylib.spark.flavour import flavour_of

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_exit_now = os._exit  # a second signal's way out: no cleanup that could hang

# JVMs whose lifetime is the Python driver's: spark-submit's `PythonRunner` (client mode,
# and the JVM pyspark starts for a plain `python` driver) and YARN's cluster-mode
# ApplicationMaster, which runs `PythonRunner` in a thread. A JVM that outlives the driver
# (a notebook's, Databricks') keeps its own signal handling.
_LAUNCHER_MAIN_CLASSES = (
    "org.apache.spark.deploy.SparkSubmit",
    "org.apache.spark.deploy.yarn.ApplicationMaster",
)


@contextlib.contextmanager
def stop_requests(spark: SparkSession) -> Iterator[threading.Event]:
    """Within the block, the returned event is set on the first SIGTERM or SIGINT, to this
    process or to the driver JVM when this process is its spark-submit Python driver.

    A second signal to this process ends it at once (exit code 128 + the signal's number),
    as a second one to the JVM ends the JVM. Python's previous handlers and the JVM's are
    put back when the block ends. A JVM that
    cannot take the handler (no Py4J gateway, as under Spark Connect) is left alone, with a
    warning that only signals to this process stop the job gracefully.
    """
    requested = threading.Event()

    def request(name: str) -> None:
        log.info("received %s: stopping after the current batch", name)
        requested.set()

    def on_signal(signum: int, frame: object) -> None:
        name = signal.Signals(signum).name
        if not requested.is_set():
            request(name)
            return
        log.warning(
            "received %s again: stopping now; a batch in flight runs again at the next start, "
            "committing nothing twice",
            name,
        )
        sys.stderr.flush()
        _exit_now(128 + signum)

    previous = {sig: signal.signal(sig, on_signal) for sig in STOP_SIGNALS}
    jvm_handlers = _install_jvm_handlers(spark, request)
    try:
        yield requested
    finally:
        for handler in jvm_handlers:
            handler.restore()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _install_jvm_handlers(
    spark: SparkSession, request: Callable[[str], None]
) -> list[_JvmSignalHandler]:
    context = flavour_of(spark).spark_context(spark)
    if context is None:  # a Connect server's JVM is no child of this process: nothing to catch
        return []
    jvm = context._jvm
    command = str(jvm.java.lang.System.getProperty("sun.java.command") or "")
    if not command.startswith(_LAUNCHER_MAIN_CLASSES):
        log.debug("driver JVM %r outlives this process: its signals are left to it", command)
        return []
    from pyspark.java_gateway import ensure_callback_server_started

    ensure_callback_server_started(context._gateway)
    handlers = []
    for sig in STOP_SIGNALS:
        name = signal.Signals(sig).name
        handler = _JvmSignalHandler(jvm, name, request)
        handler.install()
        handlers.append(handler)
    log.debug("driver JVM signals %s forwarded to the job", [h.name for h in handlers])
    return handlers


class _JvmSignalHandler:
    """A `sun.misc.SignalHandler` for one signal, implemented in Python: the JVM calls
    `handle` over Py4J's callback server, on a thread of its own."""

    def __init__(self, jvm: Any, name: str, request: Callable[[str], None]) -> None:
        self.name = name
        self._jvm = jvm
        self._request = request
        self._signal = jvm.sun.misc.Signal(name.removeprefix("SIG"))
        self._previous: Any = None
        self._lock = threading.Lock()

    def install(self) -> None:
        self._previous = self._jvm.sun.misc.Signal.handle(self._signal, self)

    def restore(self) -> None:
        """Put the JVM's previous handler back, unless a signal already did."""
        with self._lock:
            previous, self._previous = self._previous, None
        if previous is None:
            return
        from py4j.protocol import Py4JError  # a classic session's; pyspark-client has no py4j

        try:
            self._jvm.sun.misc.Signal.handle(self._signal, previous)
        except Py4JError as e:  # the JVM is already going (a second signal): nothing to restore
            log.debug("JVM %s handler not restored: %s", self.name, e)

    def handle(self, sig: Any) -> None:
        # The JVM's own handler goes back first: a second signal then ends the JVM at once.
        self.restore()
        self._request(f"{self.name} (to the driver JVM)")

    class Java:
        implements = ["sun.misc.SignalHandler"]
