"""The batch's counters in Spark's own progress reports (`StreamingQueryProgress`).

The routing tasks run inside the query's plan (`RoutingStage.routed`), and `observe` over
their result rows sums the counters every task reports and takes the percentiles of the
retry records' lateness. Spark puts these figures into each batch's progress, under
`observedMetrics["retrylib"]`, where `StreamingQueryListener`s, the Spark UI and
Databricks' dashboards find them:

    "observedMetrics": {"retrylib": {"records_main": 100, "succeeded": 97, "retried": 5,
        "retried_tier_1": 4, "retried_tier_2": 1, "dead_lettered": 2, ...,
        "handler_ms": 40, "lateness_p50_ms_tier_1": 212, "lateness_p99_ms_tier_1": 870,
        ...}}

Every counter of the metrics log line is there except `produced` (known only after the
batch's Kafka transaction); a tier's lateness percentiles are null when no retry record of
that tier was handled. A batch whose decisions come from its manifest (a replay after a
crash) runs no task, so its observed metrics are empty: its log line says `replayed`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from retrylib.retry.outcomes import Count, retried, retried_tier

if TYPE_CHECKING:
    from pyspark.sql import Column

OBSERVATION = "retrylib"
"""The name of retrylib's entry in `StreamingQueryProgress.observedMetrics`."""

PERCENTILES = (("p50", 0.5), ("p99", 0.99))


def lateness_metric(percentile: str, tier: int) -> str:
    """The observed metric of `percentile` ("p50", "p99") of tier `tier`'s lateness (0 = the
    first tier, named as users number tiers: "..._tier_1")."""
    return f"lateness_{percentile}_ms_tier_{tier + 1}"


def rows_metric(kind: str) -> str:
    """The manifest's count of a batch's result rows of `kind` ("output", ...)."""
    return f"rows_{kind}"


def metric_names(counters: tuple[str, ...], tiers: int) -> list[str]:
    """The names of the observed metrics, in order: `counters` ("retried" being the tiers'
    sum), each tier's retried counter, then each tier's lateness percentiles."""
    return [
        *counters,
        *(retried_tier(tier) for tier in range(tiers)),
        *(lateness_metric(name, tier) for tier in range(tiers) for name, _ in PERCENTILES),
    ]


def observed_columns(counters: tuple[str, ...], tiers: int) -> list[Column]:
    """The aggregate columns of `metric_names(counters, tiers)` over a batch's result rows
    (`retrylib.task.results`)."""
    from pyspark.sql import functions as F

    # Each column is one SQL expression, parsed in the JVM by one py4j call: built from
    # `functions` they took ~6 calls a counter, 0.6-1.3 s at every query start.
    def total(name: str) -> str:
        return f"coalesce(sum(cast(get_json_object(counters, '$.{name}') AS BIGINT)), 0)"

    texts = {name: total(name) for name in counters if name != Count.RETRIED}
    by_tier = {retried_tier(tier): total(retried_tier(tier)) for tier in range(tiers)}
    if Count.RETRIED in counters:
        texts[Count.RETRIED] = retried(by_tier, _sql_sum)
    texts.update(by_tier)
    columns: dict[str, Column] = {name: F.expr(text) for name, text in texts.items()}
    columns.update(_lateness_columns(tiers))
    return [columns[name].alias(name) for name in metric_names(counters, tiers)]


def _sql_sum(terms: list[str]) -> str:
    """SQL adding up the expressions `terms` (0 when there is none)."""
    return " + ".join(["0", *terms])


def decision_columns(kinds: tuple[str, ...], tiers: int) -> list[Column]:
    """The aggregate columns a batch's manifest is made of, over its result rows:
    `rows_metric(kind)` for each of `kinds`, `counters` (the tasks' counters objects, as one
    JSON list of them) and each tier's lateness percentiles (`lateness_metric`).

    Every value is a number or a string: Spark 4.0's `Observation.get` leaves an array as a
    py4j object."""
    from pyspark.sql import functions as F

    columns = {rows_metric(kind): F.count_if(F.col("kind") == kind) for kind in kinds}
    columns["counters"] = F.to_json(F.collect_list(F.col("counters")))
    columns.update(_lateness_columns(tiers))
    return [column.alias(name) for name, column in columns.items()]


def _lateness_columns(tiers: int) -> dict[str, Column]:
    """Each tier's lateness percentiles, by `lateness_metric` name."""
    from pyspark.sql import functions as F

    fractions = ", ".join(f"{fraction}D" for _, fraction in PERCENTILES)
    columns = {}
    for tier in range(tiers):
        late = f"IF(kind = 'lateness' AND lateness.tier = {tier}, lateness.lateness_ms, NULL)"
        values = f"percentile_approx({late}, array({fractions}))"
        for index, (name, _) in enumerate(PERCENTILES):
            columns[lateness_metric(name, tier)] = F.expr(f"{values}[{index}]")
    return columns
