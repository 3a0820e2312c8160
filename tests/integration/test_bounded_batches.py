"""Batches stay within `kafka.max_offsets_per_trigger`, retry tiers included, and
`--available-now` works through a backlog in several such batches, then stops: on every
Spark line (4.2 plans them in the engine; on 4.0/4.1 the source and the job do).
"""

from __future__ import annotations

import time
from collections import Counter

import pytest
from helpers import produce, read_table, run_available_now

from retrylib.batch.result import BatchResult

LIMIT = 20
RECORDS = 60


def read_per_batch(results: list[BatchResult], counter: str) -> list[int]:
    return [r.counters.get(counter, 0) for r in results if r.counters.get(counter, 0)]


@pytest.mark.parametrize("source", ["builtin", "python"])
def test_backlogs_of_main_topic_and_each_tier_run_in_bounded_batches(
    spark, bootstrap_servers, make_topic, write_config, source
):
    topic = make_topic("bounded", partitions=2)
    keys = [f"flaky2-{i}" for i in range(RECORDS)]  # fail twice: tier 1s, tier 2s, then done
    produce(bootstrap_servers, topic, [(k, "v") for k in keys], partitions=2)
    config = write_config(
        [topic],
        kafka={"max_offsets_per_trigger": LIMIT, "source": source},
        retry={"delays": ["1s", "2s"], "max_attempts": 3},
    )

    first = run_available_now(spark, config)
    time.sleep(1.5)  # every retry in the 1 s tier is due
    second = run_available_now(spark, config)
    time.sleep(2.5)  # every retry in the 2 s tier is due
    third = run_available_now(spark, config)

    batches = [read_per_batch(first, "records_main")]
    batches += [read_per_batch(run, "records_retry") for run in (second, third)]
    assert all(len(sizes) >= RECORDS // LIMIT for sizes in batches), batches
    assert all(size <= LIMIT for sizes in batches for size in sizes), batches
    assert [sum(sizes) for sizes in batches] == [RECORDS] * 3, batches
    assert sum(r.counters.get("records_retry", 0) for r in first) == 0
    assert sum(r.counters.get("records_main", 0) for r in second + third) == 0
    written = Counter(row["key"] for row in read_table(config.output.table).to_pylist())
    assert written == dict.fromkeys(keys, 1)
