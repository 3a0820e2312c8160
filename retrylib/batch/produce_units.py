"""The Kafka-produce effect: a batch's outgoing records produced from the executors, in
units, each exactly once.

The routing tasks stamp every result row with the task's partition (`unit`) and its place
in the task's output (`seq`, see `results.placed`), and Spark writes them to the batch's
staging folder. Once the batch's manifest is claimed, the driver runs one Spark job over the
outgoing records (`produce_units`):

    staging folder (Parquet) -> the outgoing records -> a partition per unit -> in unit
    order -> one Kafka transaction per unit (`sinks.produce_units`) -> one row per unit back

A unit is the outgoing records of one routing task, so what a unit holds is fixed by the
staging folder: every attempt of a unit's task, and every replay of the batch, produces the same
records under the same transactional id and marker. The units are spread over the job's
partitions one to a partition (`spread_keys`), so the work is as parallel as the routing
was. The driver gets back one row per unit (its count, and the Kafka clients opened),
never a record.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from retrylib.batch.effects import Made
from retrylib.batch.spark_errors import task_error
from retrylib.config.topic_names import produced_topic
from retrylib.errors import RetrylibError
from retrylib.sinks.markers import ControlTopic
from retrylib.sinks.produce_units import (
    UNIT_RESULT_SCHEMA,
    ProducePlan,
    ProducerSettings,
    produce_task,
)
from retrylib.steps import reached
from retrylib.task.results import OUTGOING_KIND


@dataclass(frozen=True)
class KafkaProduce:
    """The effect that produces a batch's outgoing records (retry tiers, the dead-letter
    topic, a delay router's destinations) from the executors, each unit once, with the job's
    producer `settings`."""

    settings: ProducerSettings

    @property
    def kind(self) -> str:
        return OUTGOING_KIND

    def control_topic(self) -> ControlTopic:
        """The driver's view of the control topic the produce tasks write their markers to."""
        settings = self.settings
        return ControlTopic(
            settings.bootstrap_servers,
            settings.reader_options,
            produced_topic(settings.job),
            signing_key=settings.signing_key,
            app_id=settings.app_id,
            secret_options=settings.secret_options,
        )

    def make(self, decisions: DataFrame | None, manifest: Mapping[str, Any], batch_id: int) -> Made:
        """Produce the batch's outgoing records among `decisions` from the executors.

        Raises the retrylib error a produce task failed with, as Spark reports it
        (`task_error`), or Spark's own error when none is named.
        """
        produced = opened = 0
        if decisions is not None:
            produced, opened = self._produce(decisions, manifest, batch_id)
        reached("after_produce", batch_id)
        return Made(produced=produced, clients_opened=opened)

    def _produce(
        self, decisions: DataFrame, manifest: Mapping[str, Any], batch_id: int
    ) -> tuple[int, int]:
        plan = produce_plan(self.settings, manifest, batch_id)
        try:
            return produce_units(decisions, plan)
        except Exception as e:  # a task's error, as Spark wraps it
            raised = task_error(e)
            if raised is None:
                raise
            raise raised from e


def produce_plan(
    settings: ProducerSettings, manifest: Mapping[str, Any], batch_id: int
) -> ProducePlan:
    """The produce tasks' plan for batch `batch_id`, from its `manifest`. Raises
    `RetrylibError` for a manifest of a version of retrylib that produced from the driver."""
    if "units" not in manifest:
        raise RetrylibError(
            f"batch {batch_id} was routed by an earlier version of retrylib, which "
            "produced it from the driver: run that version until the batch is done, stop "
            "it gracefully (SIGTERM), then start this one"
        )
    return ProducePlan(
        settings,
        batch_id=batch_id,
        units=manifest["units"],
        control_from=manifest["control_from"],
        not_before_ms=manifest.get("not_before_ms", 0),  # older manifests have none
    )


def produce_units(decisions: DataFrame, plan: ProducePlan) -> tuple[int, int]:
    """Produce the outgoing records among `decisions` (a batch's staging folder, read by
    Spark) in units, each once; returns (records produced, Kafka clients the tasks opened).

    Raises what Spark raises when a task fails for good (its error names the cause).
    """
    keys = F.array(*(F.lit(key) for key in spread_keys(plan.units)))
    records = (
        decisions.where(f"kind = '{OUTGOING_KIND}'")
        .select("unit", "seq", f"{OUTGOING_KIND}.*")
        .withColumn("spread", F.element_at(keys, F.col("unit") + 1))
        .repartition(plan.units, "spread")
        .sortWithinPartitions("unit", "seq")
        .drop("spread")
    )
    schema = from_arrow_schema(UNIT_RESULT_SCHEMA)
    rows = records.mapInArrow(partial(produce_task, plan), schema).collect()
    return sum(row["produced"] for row in rows), sum(row["clients_opened"] for row in rows)


# -- spreading the units over partitions ----------------------------------------------------

_MASK = 0xFFFFFFFF


def _rotate_left(value: int, bits: int) -> int:
    return ((value << bits) | (value >> (32 - bits))) & _MASK


def spark_hash_int(value: int, seed: int = 42) -> int:
    """Spark's `hash()` of an int column: Murmur3 x86 32-bit of 4 bytes, seed 42, signed.

    Spark places a row of `repartition(n, column)` in partition pmod(this, n).
    """
    k1 = (value & _MASK) * 0xCC9E2D51 & _MASK
    k1 = _rotate_left(k1, 15) * 0x1B873593 & _MASK
    h1 = _rotate_left(seed ^ k1, 13)
    h1 = (h1 * 5 + 0xE6546B64) & _MASK
    h1 ^= 4
    h1 ^= h1 >> 16
    h1 = h1 * 0x85EBCA6B & _MASK
    h1 ^= h1 >> 13
    h1 = h1 * 0xC2B2AE35 & _MASK
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 >= 1 << 31 else h1


def spread_keys(units: int) -> list[int]:
    """For each unit, a key that `repartition(units, key)` places in that unit's partition,
    so that no two units share a task."""
    keys: dict[int, int] = {}
    candidate = 0
    while len(keys) < units:
        keys.setdefault(spark_hash_int(candidate) % units, candidate)
        candidate += 1
    return [keys[unit] for unit in range(units)]
