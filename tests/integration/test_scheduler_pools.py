"""The session's scheduler pools, as Spark built them from retrylib's allocation file, and
the background threads' jobs in theirs (`retrylib.spark.scheduling`)."""

from __future__ import annotations

from retrylib.batch.at_once import Started
from retrylib.spark.scheduling import BACKGROUND_POOL


def test_spark_schedules_the_batches_first_and_background_work_in_its_own_pool(spark) -> None:
    context = spark.sparkContext
    assert context.getConf().get("spark.scheduler.mode") == "FAIR"
    listed = context._jsc.sc().getAllPools()  # as Spark read them: a Scala Seq
    pools = {pool.name(): pool for pool in (listed.apply(i) for i in range(listed.size()))}
    assert (pools["default"].weight(), pools["default"].minShare()) == (10, 2)
    assert (pools[BACKGROUND_POOL].weight(), pools[BACKGROUND_POOL].minShare()) == (1, 0)

    def pool_and_count() -> tuple[str | None, int]:
        return context.getLocalProperty("spark.scheduler.pool"), spark.range(10).count()

    assert Started(spark, pool_and_count, background=True).result() == (BACKGROUND_POOL, 10)
    assert Started(spark, pool_and_count).result() == (None, 10)
    assert context.getLocalProperty("spark.scheduler.pool") is None  # this thread's unchanged
