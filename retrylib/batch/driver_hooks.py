"""The batch hooks (`on_batch_start`, `on_batch_end`, see `retrylib.task.hooks`) as the
driver calls them: each call bounded, so a hook that hangs never holds a batch."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from retrylib.task.bounded_call import BoundedCall
from retrylib.task.hooks import Hooks


class DriverHooks(Hooks):
    """`Hooks` called on the driver, each call bounded by `timeout_s` (`BoundedCall`): a call
    still running then is counted as failed and left to run, and the hook is not called
    again until it has returned, so a hook that hangs holds one thread, never the batch or
    the job's stop.
    """

    def __init__(
        self,
        references: Mapping[str, str],
        paths: Sequence[str],
        counters: Counter[str],
        timeout_s: float,
    ) -> None:
        super().__init__(references, paths, counters)
        self._bounded = {
            name: BoundedCall(function, timeout_s, "hooks.timeout", f"hook {name}")
            for name, function in self._functions.items()
        }

    def call(self, name: str, *args: object) -> None:
        bounded = self._bounded.get(name)
        if bounded is None:
            return
        _, failure = bounded(*args)
        if failure is not None:
            self._failed(name, failure)
