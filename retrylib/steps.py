"""The named steps of a job's start and of a batch, and the one listener told when a process
reaches one.

`job`, `sinks.tables`, the batch's stage and effects (`batch.routing_stage`,
`batch.produce_units`, `batch.table_appends`, `batch.commit`) and
`sinks.transactional_producer` call `reached(step, batch_id)` at each step (a start-up step
with `STARTING` for the batch id); with no listener set that costs one comparison. A
listener is set from outside the job (the fault tests' crash listener kills the process at
a step: tests/faults/crash/), in every process it should hear from: the driver reaches the
driver's steps, a Python worker the executor's. A listener runs inline and may raise; what
it raises fails the step.

The start-up steps, in the order a job's first start reaches them (a later start reaches
those whose work it does again: the topics, the lease and the query's start, and the others
only where a crash left their work undone):

- after_topics: the job's topics exist; its runner lease is not taken yet.
- after_lease: the runner lease is held (Spark may still be starting).
- after_main_reader: the main topics' reader is chosen and recorded in the checkpoint.
- after_identity: the checkpoint's app id is recorded in it.
- after_signing_key: the checkpoint's signing key is recorded in it.
- in_table_create: a Delta table's creation is about to begin (once per table created: the
  output table, then the dead-letter table, in a thread of their own while the query starts,
  whose first batch waits for them; a metrics table's too).
- after_query_start: the streaming query has started; its first batch may not have run.

The steps, in the order a batch reaches them:

- after_handler: every task routed its records and wrote its files; no manifest yet.
- after_manifest: the batch's decisions are recorded; nothing produced or committed.
- in_produce (executor): a produce unit's records and marker were sent inside its Kafka
  transaction, not committed.
- after_unit_commit (executor): a produce unit's transaction is committed; its task has not
  returned.
- after_produce: every unit's transaction is committed; no Delta commit yet.
- after_output_commit: the output table holds the batch; the dead-letter table not yet.
- after_dead_letter_commit: both tables hold the batch; earlier batches' staging folders not
  yet removed.
- before_batch_end: the batch's effects are all done (the same state as the step
  before, reached one step later); earlier batches' staging folders not yet removed.
- after_cleanup: earlier batches' staging folders removed, `foreachBatch` about to return
  (Spark has not yet written the batch to its commit log).
"""

from __future__ import annotations

from collections.abc import Callable

STARTING = -1
"""The batch id a start-up step is reached with."""

START_STEPS = (
    "after_topics",
    "after_lease",
    "after_main_reader",
    "after_identity",
    "after_signing_key",
    "in_table_create",
    "after_query_start",
)
BATCH_STEPS = (
    "after_handler",
    "after_manifest",
    "in_produce",
    "after_unit_commit",
    "after_produce",
    "after_output_commit",
    "after_dead_letter_commit",
    "before_batch_end",
    "after_cleanup",
)
STEPS = START_STEPS + BATCH_STEPS

StepListener = Callable[[str, int], None]
"""Called with the step's name (one of `STEPS`) and the batch id (`STARTING` at start-up)."""

_listener: StepListener | None = None


def set_listener(listener: StepListener | None) -> None:
    """Make `listener` the one this process tells of each step it reaches; None for none."""
    global _listener
    _listener = listener


def reached(step: str, batch_id: int) -> None:
    """Tell the listener, if one is set, that this process reached `step` of `batch_id`."""
    if _listener is not None:
        _listener(step, batch_id)
