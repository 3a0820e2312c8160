"""A handler that kills its Python worker fails only its own record, not the job."""

from __future__ import annotations

import time

import pytest
from helpers import produce, read_table

from retrylib.job import start_query

pytestmark = pytest.mark.every_spark


def test_handler_killing_its_worker_is_a_failed_attempt(
    spark, bootstrap_servers, make_topic, write_config
):
    topic = make_topic("orders", partitions=2)
    keys = [f"ok-{i}" for i in range(20)] + ["crash-0", "crashalways-0"]
    produce(bootstrap_servers, topic, [(k, "v") for k in keys])
    config = write_config([topic], retry={"delays": ["1s"], "max_attempts": 2})

    for _ in range(4):  # availableNow runs until the retry of crash-0 has been due and handled
        query, router = start_query(spark, config, available_now=True)
        query.awaitTermination()
        router.close()
        assert query.exception() is None
        if read_table(config.output.table).num_rows == 21:
            break
        time.sleep(1.2)

    output = sorted(read_table(config.output.table).column("key").to_pylist())
    assert output == sorted(k for k in keys if k != "crashalways-0")
    [dead] = read_table(config.dead_letter.table).to_pylist()
    assert (dead["key"], dead["attempts"]) == (b"crashalways-0", 2)
    assert dead["error_class"].endswith("HandlerCrashed")
    assert "exit code 13" in dead["error_message"]
