"""The leases a redrive holds while it writes: the job's redrive lease (one redrive per job at
a time), and, where only one driver at a time may write the dead-letter table
(`retrylib.sinks.log_store`: S3 with open-source Delta's default log store), the job's runner
lease too. Holding that, the redrive writes only while the job is stopped, and the job does
not start until it is done: the table never has two writers, and no commit is lost.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING

from confluent_kafka.admin import AdminClient

from retrylib.config.model import Config
from retrylib.config.topic_names import produced_topic, redriven_topic
from retrylib.errors import LeaseHeld, RedriveError
from retrylib.job.start import take_runner_lease
from retrylib.kafka.clients import ensure_topics
from retrylib.kafka.runner_lease import redrive_group, take_lease
from retrylib.sinks.log_store import single_driver_only, spark_setting
from retrylib.state.checkpoint import Checkpoint

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


@contextmanager
def redrive_leases(spark: SparkSession, config: Config, admin: AdminClient) -> Iterator[None]:
    """Hold the job's redrive lease, and its runner lease where the dead-letter table takes
    one writing driver at a time, while the block runs.

    Raises `LeaseHeld` when another redrive runs, and `RedriveError` in one line when the
    job runs and the table takes one writer: stop the job first, or set the log store named.
    """
    kafka = config.kafka
    name = config.job.name
    what = f"redrive of {name!r}"
    why = single_driver_only(config.dead_letter.table_ref(), spark_setting(spark))
    control = {redriven_topic(name): 1, **({produced_topic(name): 1} if why else {})}
    options = kafka.client_options()
    ensure_topics(
        admin,
        control,
        create=kafka.create_topics,
        replication_factor=kafka.new_topics.replication_factor,
    )
    with ExitStack() as leases:
        redrive = take_lease(
            kafka.bootstrap_servers,
            options,
            admin,
            topic=redriven_topic(name),
            group=redrive_group(name),
            what=what,
        )
        leases.callback(redrive.release)
        if why is not None:
            place = Checkpoint(config.job.checkpoint).place(spark)
            try:
                runner = take_runner_lease(config, place, what)
            except LeaseHeld as held:
                raise RedriveError(
                    f"job {name!r} is running and {why}: stop the job, then redrive ({held})"
                ) from None
            leases.callback(runner.release)
            log.info("%s holds the job's runner lease while it writes: %s", what, why)
        yield
