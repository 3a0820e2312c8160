"""Running a job until it finishes (availableNow), fails, is told to stop, or loses its
runner lease: `retrylib run` and a user's script."""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial

from retrylib.batch.spark_errors import no_space_error, spark_error_line, task_error
from retrylib.config.model import AnyConfig
from retrylib.errors import LeaseHeld
from retrylib.job.start import Prepared, prepare_to_run, start_query
from retrylib.job.stopping import stop_gracefully
from retrylib.logs import redact_secrets, spark_log_conf
from retrylib.spark.flavour import flavour_of
from retrylib.spark.session import build_spark_session
from retrylib.spark.shipping import ship_code
from retrylib.spark.signals import stop_requests

log = logging.getLogger(__name__)


def run(config: AnyConfig, *, available_now: bool = False, master: str | None = None) -> int:
    """Run the job until it finishes (available-now), fails, or gets SIGTERM/SIGINT.

    Returns the process exit code: 0 when it finished or was stopped, 1 when the query
    failed (the error is logged). Raises the `RetrylibError` that failed a batch when
    retrylib detected it itself (`TableWriteError`, ...), and Spark's error when the query
    failed otherwise. Raises `LeaseHeld` when another copy runs the job from the same
    checkpoint (at start, or when it took the lease over while the brokers did not hear
    from this one).

    A script of yours, run with `python` or `spark-submit`, runs a job so. The last line is
    not run by the doctests (`+SKIP`): it starts Spark and a query that runs until stopped.

    >>> import sys
    >>> from retrylib import load_config, run
    >>> sys.exit(run(load_config("job.toml")))  # doctest: +SKIP
    """
    redact_secrets(config.secret_values())
    # Topics and lease are made ready while Spark starts: a group's first rebalance waits
    # for the broker's group.initial.rebalance.delay.ms (3 s by default).
    with ThreadPoolExecutor(1, thread_name_prefix="retrylib-prepare") as pool:
        preparing = pool.submit(prepare_to_run, config)
        try:
            spark = build_spark_session(
                f"retrylib-{config.job.name}", master=master, extra=spark_log_conf()
            )
            ship_code(spark, config)
        except BaseException:
            preparing.add_done_callback(_release_taken)
            raise
        prepared = preparing.result()
    with stop_requests(spark) as stop_requested:
        query, batch_commit = start_query(
            spark, config, available_now=available_now, prepared=prepared
        )
        lease = batch_commit.lease  # the lease of the checkpoint's place (`lease_of_place`)
        try:
            try:
                while (
                    query.isActive and not stop_requested.is_set() and not lease.taken_over.is_set()
                ):
                    query.awaitTermination(0.5)
            except Exception as error:  # the query failed: Spark's wrapping of what failed it
                # Raised outside this process's batch function: in the batch on a Connect
                # server, or in the retrylib_kafka source (Spark runs it in a Python worker).
                if batch_commit.failure is None:
                    batch_commit.failure = task_error(error) or no_space_error(error)
                if batch_commit.failure is None:
                    raise
            if batch_commit.failure is not None:
                raise batch_commit.failure
            batch_commit.tables_made()
            stop = partial(
                stop_gracefully,
                query,
                batch_commit,
                config.job.stop_timeout_ms / 1000,
                flavour_of(spark).job_canceller(spark),
            )
            if lease.taken_over.is_set():
                stop()
                raise LeaseHeld(
                    f"job {config.job.name!r}: another copy took the lease {lease.group} while "
                    "the brokers did not hear from this one; this copy stopped"
                )
            if stop_requested.is_set() and stop():
                return 0  # what the stop interrupted ended failed by it; it runs again
            error = query.exception()
            if error is not None:
                # Spark's message is the cause's, then the query's whole plan (Spark's own
                # log above holds it, with the trace): the first line says what failed.
                log.error(
                    "query %s failed: %s",
                    config.job.name,
                    spark_error_line(str(error) or repr(error)),
                )
                return 1
            return 0
        finally:
            batch_commit.close()


def _release_taken(preparing: Future[Prepared]) -> None:
    if preparing.exception() is None:
        preparing.result().lease.release()
