"""The modules the Python workers import ahead of a job's first batch (`job.python_workers`)."""

from __future__ import annotations

from retrylib.batch import routing_stage
from retrylib.job.python_workers import TASK_MODULES
from retrylib.sinks import produce_units
from retrylib.source.kafka_source import KafkaStreamReader
from retrylib.task.forwarding import run_forwarding_task
from retrylib.task.routing import run_task


def test_the_modules_imported_ahead_are_those_of_every_function_the_tasks_run() -> None:
    """A worker unpickles a task's function by its module: one moved elsewhere would leave
    its new module to the first batch, and the start-up job would import one no task needs."""
    task_functions = (
        routing_stage._batch_task,
        run_task,
        run_forwarding_task,
        KafkaStreamReader.read,
        produce_units.produce_task,
    )
    assert set(TASK_MODULES) == {function.__module__ for function in task_functions}
