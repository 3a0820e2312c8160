"""The user's lifecycle hooks (`[hooks]`): functions told what the job does with each record
and each batch. They watch; they cannot change or fail what the job decides.

Record hooks run on the executors, in the task that handles the record, like the handler:

- `before_record(record)` before each handler call;
- `after_record(record, error)` after it: `error` is what the call raised, None when it
  returned;
- `on_retry(record, tier, error)` when a failed record is sent to retry tier `tier`
  (1 = the first);
- `on_dead_letter(record, reason, error)` when a record goes to the dead letter, `reason`
  being its dead letter's reason (`retry.outcomes.Reason`).

They run under the handler's limit (`handler.timeout`), kept as a handler call's is
(`task.call_bounds`): a call still running then is interrupted and counted as failed, and
one that does not stop has its process ended.

Batch hooks run on the driver: `on_batch_start(batch_id)` and `on_batch_end(batch_id,
counters)`, with the batch's counters (`retry.outcomes.Count`). Each call is bounded
(`hooks.timeout`, `batch.driver_hooks`): one that has not returned by then is left running in its
thread and counted, and the batch goes on.

A hook that raises, whatever it raises, is counted (`hook_errors`) and logged, its first
failure in each task (or, on the driver, in each run of the job) with the error. Like the
handler, record hooks are called again for a batch replayed before its decisions were
recorded.

Hooks are functions in a module of the user's, named in `[hooks]` (`on_dead_letter =
"orders_hooks:page_someone"`, `on_batch_end = "orders_hooks:push_counters"`); called here
with what the job passes them:

>>> from retrylib import NonRetryable, Record
>>> from retrylib.retry.outcomes import Reason
>>> def page_someone(record: Record, reason: str, error: BaseException) -> None:
...     where = f"{record.topic}[{record.partition}]@{record.offset}"
...     print(f"dead letter {where}: {reason} ({error})")
>>> def push_counters(batch_id: int, counters: dict[str, int]) -> None:
...     print(f"batch {batch_id}: {counters.get('dead_lettered', 0)} dead-lettered")
>>> record = Record(b"o-7", b"{}", [], "orders", 0, 7, 0)
>>> page_someone(record, Reason.NON_RETRYABLE, NonRetryable("negative total"))
dead letter orders[0]@7: non_retryable (negative total)
>>> push_counters(12, {"records_main": 200, "succeeded": 199, "dead_lettered": 1})
batch 12: 1 dead-lettered
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from retrylib.config.importing import import_object
from retrylib.retry.outcomes import Count
from retrylib.task.call_bounds import TimedCall, call_isolated

log = logging.getLogger(__name__)


class Hooks:
    """The hooks named in `references` (hook name -> "module:function"), imported with
    `paths` on sys.path, their failures counted in `counters`.

    With `timed` (the handler's limit, `handler.timeout`), a call in the task's main thread
    is bounded as a handler call is, in a process of its own when `isolate` (as the
    handler's calls are then); on a lane (`handler.parallelism`), the lane's limit covers
    the hooks with the handler call they surround."""

    def __init__(
        self,
        references: Mapping[str, str],
        paths: Sequence[str],
        counters: Counter[str],
        timed: TimedCall | None = None,
        *,
        isolate: bool = False,
    ) -> None:
        self._references = dict(references)
        self._timed = timed if timed is not None and (timed.timeout_ms or isolate) else None
        self._isolate = isolate
        self._functions: dict[str, Callable[..., object]] = {
            name: import_object(reference, paths)  # type: ignore[misc]
            for name, reference in references.items()
        }
        self._counters = counters
        self._logged: set[str] = set()
        self._failures = threading.Lock()  # record hooks may run on several lanes at once
        self.around_calls = "before_record" in self._functions or "after_record" in self._functions
        """Whether a hook watches each handler call (the handler loop checks it once)."""

    def call(self, name: str, *args: object) -> None:
        """Call hook `name` with `args` if it is set; what it raises is counted and logged."""
        function = self._functions.get(name)
        if function is None:
            return
        try:
            if self._timed is None or threading.current_thread() is not threading.main_thread():
                function(*args)
            elif self._isolate:
                call_isolated(self._timed, f"hook {name}", function, *args)
            else:
                self._timed.call_named(f"hook {name}", function, *args)
        except BaseException as error:  # a hook never stops the job, whatever it raises
            self._failed(name, f"raised {type(error).__name__}: {error}")

    def _failed(self, name: str, what: str) -> None:
        """Count a failed call of hook `name`; log the first of each hook, saying `what`."""
        with self._failures:
            self._counters[Count.HOOK_ERRORS] += 1
            first = name not in self._logged
            self._logged.add(name)
        if first:
            log.warning(
                "hook %s (%s) %s; the job goes on, and counts each failure as hook_errors "
                "(only the first of this hook is logged here)",
                name,
                self._references[name],
                what,
            )
