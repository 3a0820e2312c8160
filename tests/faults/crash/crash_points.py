"""The crash listener of the fault tests: kill the job when it reaches a named step of a
batch (`retrylib.steps`).

A test asks for a crash with `crash_env(...)`, added to the job's environment: it puts this
folder on PYTHONPATH, so that `sitecustomize` beside this file installs the listener at the
start of every Python process of the job (the driver, Spark's Python daemon, whose forked
workers inherit it, and any other Python process Spark starts with that environment). When
a process reaches the named step it kills itself with SIGKILL (no cleanup, as a machine
failure would). Settings, all read once at install:

- RETRYLIB_CRASH_AT: the step, one of `STEPS`; any other value fails every process of the
  job at its start, so a typo cannot make a fault test pass without ever crashing.
- RETRYLIB_CRASH_BATCH: crash only in this batch id.
- RETRYLIB_CRASH_SKIP: let this many hits of the step pass before crashing (default 0).
- RETRYLIB_CRASH_ONCE: a file path; only the process that creates it crashes, once, so a
  step in an executor that Spark retries is passed the second time.
- RETRYLIB_CRASH_WATCH: a path or URI; at the step the process goes on, and a thread kills
  it once that path exists (polled through the driver's Hadoop file system, so an HDFS path
  too), so that the crash lands inside the work the step begins: `in_table_create` with a
  table's `_delta_log` is a crash inside Delta's creation of the table, after its log
  folder is made and before its first commit (a window of a second or more).

What dies: when the driver leads its own process group (the tests start the job in a
session of its own), a crash takes the whole group, driver, Spark's JVM and the Python
workers at the same instant; the driver hands the group to the workers in
RETRYLIB_CRASH_GROUP (Spark's Python daemon puts them in a group of their own). Otherwise
only the process at the step dies: on an executor that is a lost Python worker, whose task
Spark runs again.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

from retrylib.steps import STEPS, set_listener

_HOOK_DIR = Path(__file__).resolve().parent
_AT = "RETRYLIB_CRASH_AT"
_BATCH = "RETRYLIB_CRASH_BATCH"
_SKIP = "RETRYLIB_CRASH_SKIP"
_ONCE = "RETRYLIB_CRASH_ONCE"
_GROUP = "RETRYLIB_CRASH_GROUP"
_WATCH = "RETRYLIB_CRASH_WATCH"
_WATCH_POLL_S = 0.005


def crash_env(
    at: str,
    *,
    batch: int | None = None,
    skip: int | None = None,
    once: Path | None = None,
    watch: str | None = None,
) -> dict[str, str]:
    """The environment that makes a job started with it crash at step `at` (see the module
    docstring): this folder first on PYTHONPATH, and every setting, the ones not given
    empty (so that none is inherited)."""
    inherited = os.environ.get("PYTHONPATH")
    return {
        "PYTHONPATH": f"{_HOOK_DIR}{os.pathsep}{inherited}" if inherited else str(_HOOK_DIR),
        _AT: at,
        _BATCH: "" if batch is None else str(batch),
        _SKIP: "" if skip is None else str(skip),
        _ONCE: "" if once is None else str(once),
        _WATCH: watch or "",
    }


class CrashListener:
    """Kills this process (or its job) at the step the environment names; see the module
    docstring."""

    def __init__(
        self, at: str, batch: int | None, skip: int, once: str | None, watch: str | None
    ) -> None:
        self.at = at
        self.batch = batch
        self.skip = skip
        self.once = once
        self.watch = watch

    def __call__(self, step: str, batch_id: int) -> None:
        if step != self.at or (self.batch is not None and self.batch != batch_id):
            return
        if self.skip > 0:
            self.skip -= 1
            return
        if self.once is not None:
            try:
                os.close(os.open(self.once, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                return
        message = f"retrylib fault injection: crash at {step} in batch {batch_id}\n".encode()
        if self.watch is None:
            os.write(2, message)  # stderr, unbuffered
            self._kill_now(message)
        else:
            threading.Thread(target=self._kill_once_there, args=(message,), daemon=True).start()

    def _kill_once_there(self, message: bytes) -> None:
        """Kill the job once `self.watch` exists (this process is the Spark driver)."""
        from pyspark import SparkContext

        context = SparkContext._active_spark_context
        path = context._jvm.org.apache.hadoop.fs.Path(self.watch)
        fs = path.getFileSystem(context._jsc.hadoopConfiguration())
        while not fs.exists(path):
            time.sleep(_WATCH_POLL_S)
        message = message.replace(b"\n", f" ({self.watch} appeared)\n".encode())
        os.write(2, message)
        self._kill_now(message)

    def _kill_now(self, message: bytes) -> None:
        group = os.environ.get(_GROUP)
        if group is not None and self.once is None:  # the whole job: driver, JVM and workers
            if int(group) != os.getpid():
                # A worker's stderr (and under spark-submit the driver's) reaches the log
                # through a thread of the JVM, which dies with the group before it copies
                # the line: append it to the group leader's stderr (the log) too. The log
                # must be open for appending in the JVM as well, or the JVM's next write, at
                # its own offset, lands over this line (the harness opens it so).
                try:
                    with open(f"/proc/{group}/fd/2", "ab", buffering=0) as driver_stderr:
                        driver_stderr.write(message)
                except OSError:
                    pass
            os.killpg(int(group), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)


def install() -> None:
    """Set a `CrashListener` as this process's step listener if RETRYLIB_CRASH_AT asks for
    one. Raises `ValueError` when it names no step."""
    at = os.environ.get(_AT) or None
    if at is None:
        return
    if at not in STEPS:
        raise ValueError(f"{_AT}={at!r} is not a step; one of {STEPS}")
    if _GROUP not in os.environ and os.getpgid(0) == os.getpid():
        os.environ[_GROUP] = str(os.getpid())  # inherited by the JVM and its workers
    batch, skip = os.environ.get(_BATCH), os.environ.get(_SKIP)
    once, watch = os.environ.get(_ONCE) or None, os.environ.get(_WATCH) or None
    set_listener(
        CrashListener(at, int(batch) if batch else None, int(skip) if skip else 0, once, watch)
    )
