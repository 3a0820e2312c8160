"""The last bound on a user call in a Spark Python worker: a process of its own that ends the
worker when a call has outlived its limit and the grace after it.

An interrupt stops a call only when the call returns to Python and lets it through:
`TimedCall`'s SIGALRM, or the `HandlerTimeout` a lane's thread is given (`task.lanes`). A
handler that catches `BaseException` in a loop, blocks SIGALRM, or waits in C code that
never returns (or holds the GIL, so that no thread of the worker runs at all) is past
anything the worker itself can do. So the worker starts a watchdog once, a small Python
process of its own (`python -c`, about 20 MB: a forked copy would keep the worker's heap as
it was, page by page, as the worker rewrites it), which shares one number with it through
a memory file: the deadline of the call in progress (0 when none runs). The worker writes
it as a call starts and ends (a store to shared memory, no system call); the watchdog reads
it a few times a second and, once it has passed, logs one ERROR line and kills the worker
(SIGKILL). Spark then fails the task with "Python worker exited unexpectedly", and the
batch runs again with each call in a process of its own (`batch.routing_stage`), where the
parent bounds each child itself (`call_bounds.call_isolated`): the guilty record alone fails,
as a `HandlerTimeout`.

The watchdog keeps no file or socket of the worker's open (Spark sees the worker's end at
once) and exits as soon as its worker is gone. It finds retrylib on the worker's own
`sys.path` (an installed package, or the zip Spark ships), and logs as the worker does
(`retrylib.logs`).
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import signal
import subprocess
import sys
import tempfile
import time

log = logging.getLogger(__name__)

GRACE_S = 2.0
"""How long a call that outlived its limit has to stop after it was first interrupted
before its worker is ended: time for its `finally` blocks to run."""
_TICK_S = 0.2
"""How often the watchdog reads the deadline."""


class Watchdog:
    """The watchdog of this process (see the module docstring); `WATCHDOG` is the one."""

    def __init__(self) -> None:
        self._memory: mmap.mmap | None = None
        self._file = -1  # the memory file's descriptor, once shared
        self._deadline = ctypes.c_double()  # this process's until `start`: no watchdog reads it
        self._limit = ctypes.c_double()
        self._watched_pid = 0  # the process the watchdog runs for, if it runs
        self._process: subprocess.Popen | None = None

    def start(self, limit_s: float) -> None:
        """Make sure this process's watchdog runs (it is started once per process), for calls
        limited to `limit_s`."""
        parent = os.getpid()
        if self._watched_pid != parent:
            self._watched_pid = parent
            self._share_memory()
            self._process = subprocess.Popen(
                [sys.executable, "-c", _MAIN, str(parent), str(self._file)],
                pass_fds=(self._file,),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, sys.path))},
            )
        self._limit.value = limit_s

    def _share_memory(self) -> None:
        """The two numbers in a memory file of this process's own, which the watchdog maps."""
        if hasattr(os, "memfd_create"):
            self._file = os.memfd_create("retrylib-watchdog")
        else:  # macOS: an unlinked file
            self._file = os.dup(tempfile.TemporaryFile().fileno())
        os.ftruncate(self._file, _SIZE)
        self._memory = mmap.mmap(self._file, _SIZE)
        self._deadline, self._limit = _numbers(self._memory)

    @property
    def deadline(self) -> ctypes.c_double:
        """The number the watchdog reads, for a caller that writes it itself on a hot path
        (`TimedCall`): the deadline (`time.monotonic()`) of the call in progress, 0 when
        none runs. Asked again after `stand_down`, which replaces it."""
        return self._deadline

    def arm(self, started: float) -> None:
        """A call started at `started` (`time.monotonic()`): end this process if the call has
        not ended (`disarm`) `GRACE_S` after its limit."""
        self._deadline.value = started + self._limit.value + GRACE_S

    def arm_unless_earlier(self, started: float) -> None:
        """`arm` for a call started at `started`, unless a call that started earlier is
        armed: for calls that run at once (`task.lanes`), the first to end the process."""
        deadline = started + self._limit.value + GRACE_S
        armed = self._deadline.value
        if not armed or deadline < armed:
            self._deadline.value = deadline

    def disarm(self) -> None:
        """No call runs now."""
        self._deadline.value = 0.0

    def stand_down(self) -> None:
        """In a process forked to run one call (`call_isolated`), whose parent bounds it:
        its calls write to a number no watchdog reads, and it starts none."""
        self._deadline = ctypes.c_double()
        self._limit = ctypes.c_double()
        self._watched_pid = os.getpid()


_SIZE = ctypes.sizeof(ctypes.c_double) * 2


def _numbers(memory: mmap.mmap) -> tuple[ctypes.c_double, ctypes.c_double]:
    """The deadline and the limit, as they lie in the shared memory."""
    return (
        ctypes.c_double.from_buffer(memory),
        ctypes.c_double.from_buffer(memory, ctypes.sizeof(ctypes.c_double)),
    )


_MAIN = "from retrylib.task.watchdog import main; main()"
"""The watchdog process's program: `main` with the worker's pid and the memory file's fd."""


def main() -> None:
    """The watchdog's life (`python -c _MAIN WORKER_PID FD`): read the deadline every
    `_TICK_S` until the worker is gone or the deadline has passed, then kill the worker."""
    from retrylib.logs import configure_logging

    configure_logging()
    worker, fd = int(sys.argv[1]), int(sys.argv[2])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is for the job, which stops it
    deadline, limit = _numbers(mmap.mmap(fd, _SIZE))
    while os.getppid() == worker:
        time.sleep(_TICK_S)
        due = deadline.value
        if due and time.monotonic() > due:
            log.error(
                "ending Python worker %d: a call of yours has run %gs past its limit "
                "(handler.timeout %gs) and did not stop when interrupted; its task runs "
                "again with each call in a process of its own, where that call fails "
                "alone as a HandlerTimeout",
                worker,
                GRACE_S,
                limit.value,
            )
            os.kill(worker, signal.SIGKILL)
            return


WATCHDOG = Watchdog()
"""This process's watchdog."""
