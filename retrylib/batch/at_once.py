"""The driver's steps that run at once: each in a thread of its own that carries the Spark
session's job group (classic) or tags (Spark Connect), so stopping the query cancels them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyspark import InheritableThread
from pyspark.sql import SparkSession

from retrylib.spark.flavour import flavour_of
from retrylib.spark.scheduling import BACKGROUND_POOL


def all_at_once(spark: SparkSession | None, *calls: Callable[[], Any]) -> list[Any]:
    """Run `calls` at once, the first in this thread and each other in a thread of its own
    (`Started`); returns their results in order once all have ended. When calls fail, the
    first one's error (in the order given) is raised, after every call has ended."""
    started = [Started(spark, call) for call in calls[1:]]
    try:
        first = calls[0]()
    finally:
        for call in started:
            call.wait()
    return [first, *(call.result() for call in started)]


class Started:
    """A call running in a thread of its own, started at once; with `background`, its Spark
    jobs in the scheduler's background pool (`retrylib.spark.scheduling`), which has the
    cores the batches leave.

    The thread carries the starting thread's Spark local properties (inside a batch, the
    streaming query's job group), so stopping the query cancels its jobs too; in a Spark
    Connect session, `spark`'s tags. In a classic session `spark` is the active session of
    the thread's side in the JVM: Delta computes some reads there with it (a table state it
    started computing in its own pool and lost, as to a concurrent OPTIMIZE), and fails
    without one.
    """

    def __init__(
        self, spark: SparkSession | None, call: Callable[[], Any], *, background: bool = False
    ) -> None:
        self._value: Any = None
        self._error: BaseException | None = None
        self._spark = spark
        self._background = background
        self._thread = (
            InheritableThread(self._run, args=(call,))
            if spark is None
            else flavour_of(spark).thread(spark, self._run, (call,))
        )
        self._thread.start()

    def _run(self, call: Callable[[], Any]) -> None:
        try:
            if self._spark is not None:
                flavour = flavour_of(self._spark)
                flavour.make_active(self._spark)
                if self._background:
                    flavour.use_pool(self._spark, BACKGROUND_POOL)
            self._value = call()
        except BaseException as error:  # raised in the thread that asks for the result
            self._error = error

    def wait(self) -> None:
        self._thread.join()

    def running(self) -> bool:
        return self._thread.is_alive()

    def result(self) -> Any:
        """The call's result once it has ended; raises its error if it failed."""
        self.wait()
        if self._error is not None:
            raise self._error
        return self._value
