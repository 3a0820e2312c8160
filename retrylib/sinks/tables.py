"""The one place the job touches Delta tables, all through Spark's own Delta writer (delta-spark).

A table is named by a `TableRef` (`table_ref`): a path or URI, or a catalog name.

Exactly-once appends use Delta's idempotent writes: every append carries the writer options
`txnAppId` (the checkpoint's app id, `Checkpoint.app_id`) and `txnVersion` (the batch id),
and Delta records them as a `txn` action in the same commit as the data. A later append
whose version is not above the one the table holds for that app id is skipped by Delta
itself, so a replayed batch changes nothing. An append of an empty DataFrame still commits a
version holding only that `txn` action, so a batch without rows is recorded as done all the
same.

Cost, measured on local[2] with a small table (Delta 4.4): the app transactions a table
holds are read from its latest version's checksum file in a millisecond
(`committed_version`); reconstructing the snapshot's state for them costs three Spark jobs,
0.5-0.75 s per new version (with Delta's default of 50 snapshot partitions several seconds:
`spark.databricks.delta.snapshotPartitions` is set low). Delta's own check in an append with
txn options still reconstructs it, so the append takes 0.8 s and four jobs; with the state
computed ahead in another thread (`prepare_append`) it takes 0.2-0.3 s and one job, as a
plain append does. A replayed append is skipped in 20 ms with none.

Works on a classic session and on a Spark Connect client alike (Delta's SQL extension and
catalog configured on the Spark side; no Delta Connect plugin needed): tables are changed
through SQL. Only a path's table's existence, their creation and the committed transactions
differ, which the session's flavour (`retrylib.spark.flavour`) answers: no public API or SQL
command exposes the transactions, so a classic session reads them through py4j, and a
Connect client, which has no JVM, from the commits' `userMetadata` (`commit_mark`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from retrylib.config.table_ref import TableRef, is_uri
from retrylib.errors import RetrylibError
from retrylib.spark.delta_sql import commit_mark
from retrylib.spark.flavour import flavour_of
from retrylib.state.files import delete_tree, join, list_names
from retrylib.steps import STARTING, reached

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import DataType, StructType

log = logging.getLogger(__name__)

_NO_PROPERTIES: Mapping[str, str] = MappingProxyType({})
# A commit or checkpoint in a Delta log: "<20 digits>.json", "<20 digits>.checkpoint...".
_DELTA_LOG_VERSION = re.compile(r"\d{20}\.(json|checkpoint)")


def table_exists(spark: SparkSession, ref: TableRef) -> bool:
    """Whether a Delta table exists at `ref`.

    A path with no Delta log (missing, empty, or holding other files) gives False. Raises
    `RetrylibError` when a catalog name exists but is not a Delta table, since creating or
    appending there would fail later with a less clear error.
    """
    target = ref.resolved()
    if target.is_path:
        return flavour_of(spark).delta_path_exists(spark, target)
    if not spark.catalog.tableExists(target.text):
        return False
    provider = _catalog_provider(spark, target.text)
    if provider != "delta":
        raise RetrylibError(
            f"catalog table {target} is a {provider or 'non-Delta'} table, not a Delta table: "
            "name a new table or a Delta table in the config"
        )
    return True


def _catalog_provider(spark: SparkSession, name: str) -> str | None:
    """The `Provider` line of DESCRIBE TABLE EXTENDED, lower-cased (None for views)."""
    # DESCRIBE DETAIL would also say the format, but for Delta it reads the file statistics,
    # which reconstructs the snapshot's state.
    for row in spark.sql(f"DESCRIBE TABLE EXTENDED {name}").collect():
        if row.col_name == "Provider":
            return row.data_type.strip().lower()
    return None


def read_table(spark: SparkSession, ref: TableRef) -> DataFrame:
    """The latest version of the table at `ref`, as a DataFrame.

    Raises Spark's `AnalysisException` when there is no such table.
    """
    target = ref.resolved()
    if target.is_path:
        return spark.read.format("delta").load(target.text)
    return spark.read.table(target.text)


def ensure_table(
    spark: SparkSession,
    ref: TableRef,
    schema: StructType,
    *,
    what: str,
    partition_by: Sequence[str] = (),
    properties: Mapping[str, str] = _NO_PROPERTIES,
    evolve: bool = False,
) -> None:
    """Create the Delta table at `ref` with `schema` unless it exists, then check its columns.

    A new table gets `partition_by` and the table `properties`; an existing one keeps its
    own. Columns are matched by name, ignoring case (as Spark resolves them) and
    nullability. With `evolve`, columns the config has and the table lacks are accepted:
    appends with `evolve` add them. Everything else must match.

    `what` says what the table is for ("output", "dead-letter") in messages.

    Raises `RetrylibError` when a partition column is not in `schema`, when the existing
    table has columns the config lacks, lacks columns the config has (unless `evolve`), or
    holds a column with another type, listing every difference; and when a catalog name
    holds a non-Delta table.
    """
    target = ref.resolved()
    columns = {field.name.lower() for field in schema.fields}
    unknown = [column for column in partition_by if column.lower() not in columns]
    if unknown:
        raise RetrylibError(
            f"{what} table {ref}: partition column(s) {', '.join(unknown)} not in the schema "
            f"(columns: {', '.join(schema.fieldNames())}); partition by columns of the schema"
        )
    if not table_exists(spark, target):
        _remove_log_without_commit(spark, target, what)
        reached("in_table_create", STARTING)
        # Keeping the schema's NOT NULL columns; a table created meanwhile by someone else
        # is left as it is (its columns are checked next).
        flavour_of(spark).create_delta_table(spark, target, schema, partition_by, properties)
        log.info("created %s table %s", what, target)
    existing = read_table(spark, target).schema
    differences = column_differences(existing, schema, evolve=evolve)
    if differences:
        fix = "Point the config at a new table, or migrate this one (ALTER TABLE)"
        if not evolve and not column_differences(existing, schema, evolve=True):
            fix += ", or enable schema evolution for it to add the missing columns"
        raise RetrylibError(f"{what} table {ref} {differences}. {fix}")


def _remove_log_without_commit(spark: SparkSession, target: TableRef, what: str) -> None:
    """Remove the Delta log at the path `target` when it holds no commit: what a creation cut
    short by a crash leaves (Delta makes the log's folders before it writes version 0).

    Such a log is no table, yet Delta refuses to create one over it ("already exists"), which
    would stop every later start. With no commit there is no data to lose. A catalog name, and
    a URI through Spark Connect (no file system API on the client), are left to Delta.
    """
    if not target.is_path or (is_uri(target.text) and not flavour_of(spark).reaches_uris):
        return
    log_folder = join(target.text, "_delta_log")
    names = list_names(spark, log_folder)  # none for a missing folder as for an empty one
    if any(_DELTA_LOG_VERSION.match(name) for name in names):
        return
    if names:
        log.warning(
            "%s table %s: its Delta log holds no commit (a creation cut short); creating the "
            "table anew",
            what,
            target,
        )
    delete_tree(spark, log_folder)


def column_differences(table: StructType, config: StructType, *, evolve: bool = False) -> str:
    """What keeps rows of schema `config` from being appended to a table of schema `table`,
    as a phrase that follows the table's name; empty when they fit.

    Columns match by name ignoring case (as Spark resolves them); nullability is ignored at
    every depth. The phrase lists missing columns (in `config`, not in `table`), extra
    columns (in `table`, not in `config`) and each type change, as in
    "differs from the config: column total: table has DOUBLE, config has STRING".
    With `evolve`, missing columns are allowed: an append with `evolve` adds them.
    """
    in_table = {field.name.lower(): field for field in table.fields}
    in_config = {field.name.lower(): field for field in config.fields}
    problems = []
    missing = [field for name, field in in_config.items() if name not in in_table]
    if missing and not evolve:
        problems.append("missing columns (in the config, not in the table): " + _columns(missing))
    extra = [field for name, field in in_table.items() if name not in in_config]
    if extra:
        problems.append("extra columns (in the table, not in the config): " + _columns(extra))
    for name, field in in_config.items():
        existing = in_table.get(name)
        if existing is None:
            continue
        if _without_nullability(existing.dataType) != _without_nullability(field.dataType):
            problems.append(
                f"column {field.name}: table has {_type_sql(existing.dataType)}, "
                f"config has {_type_sql(field.dataType)}"
            )
    return "differs from the config: " + "; ".join(problems) if problems else ""


def _columns(fields: Sequence[Any]) -> str:
    return ", ".join(f"{field.name} {_type_sql(field.dataType)}" for field in fields)


def _without_nullability(data_type: DataType) -> DataType:
    """`data_type` with every nullable flag set, so that types compare by shape alone."""
    from pyspark.sql.types import ArrayType, MapType, StructField, StructType

    if isinstance(data_type, StructType):
        return StructType(
            [StructField(f.name, _without_nullability(f.dataType), True) for f in data_type]
        )
    if isinstance(data_type, ArrayType):
        return ArrayType(_without_nullability(data_type.elementType), True)
    if isinstance(data_type, MapType):
        return MapType(
            _without_nullability(data_type.keyType), _without_nullability(data_type.valueType)
        )
    return data_type


def _type_sql(data_type: DataType) -> str:
    """A type as Spark SQL writes it (`DOUBLE`, `ARRAY<STRING>`), field names kept as they are."""
    from pyspark.sql.types import ArrayType, MapType, StructType

    if isinstance(data_type, StructType):
        return "STRUCT<" + ", ".join(f"{f.name}: {_type_sql(f.dataType)}" for f in data_type) + ">"
    if isinstance(data_type, ArrayType):
        return f"ARRAY<{_type_sql(data_type.elementType)}>"
    if isinstance(data_type, MapType):
        return f"MAP<{_type_sql(data_type.keyType)}, {_type_sql(data_type.valueType)}>"
    return data_type.simpleString().upper()


def append_once(
    df: DataFrame, ref: TableRef, *, app_id: str, batch_id: int, evolve: bool = False
) -> bool:
    """Append `df` to the Delta table at `ref` unless batch `batch_id` of `app_id` is in it.

    The commit carries the transaction (`app_id`, `batch_id`); Delta skips the append when the
    table already holds a version >= `batch_id` for `app_id`, so replaying a batch, or an
    older one, changes nothing. An empty `df` still commits, recording the transaction.
    With `evolve`, columns of `df` the table lacks are added (`mergeSchema`). The commit's
    `userMetadata` names the app id and batch too (`commit_mark`), where DESCRIBE HISTORY
    shows it.

    Returns True when this call committed a new table version, False when Delta skipped it.
    That assumes one writer per `app_id` at a time, as a streaming query is: another writer
    with other app ids may commit meanwhile without confusing the answer.

    Raises `ValueError` for a negative `batch_id` (Delta refuses those), Spark's
    `AnalysisException` when the table does not exist (call `ensure_table` first) or the
    columns do not fit, and Delta's `ConcurrentTransactionException` when another writer
    committed the same `app_id` at the same time.
    """
    if batch_id < 0:
        raise ValueError(f"batch_id must be >= 0, got {batch_id!r}")
    spark = df.sparkSession
    target = ref.resolved()
    # The write runs even when the table holds the batch: Delta stays the one that decides,
    # and a skipped write neither computes `df` nor writes files.
    writer = (
        df.write.format("delta")
        .mode("append")
        .option("txnAppId", app_id)
        .option("txnVersion", str(batch_id))
        .option("userMetadata", commit_mark(app_id, batch_id))
    )
    if evolve:
        writer = writer.option("mergeSchema", "true")
    return flavour_of(spark).append_committed(
        spark, target, app_id, batch_id, lambda: _save(writer, target)
    )


def _save(writer: Any, target: TableRef) -> None:
    if target.is_path:
        writer.save(target.text)
    else:
        writer.saveAsTable(target.text)


def committed_version(spark: SparkSession, ref: TableRef, app_id: str) -> int | None:
    """The last batch id (`txnVersion`) that the table at `ref` holds for `app_id`.

    None when the table does not exist or has no transaction of `app_id`. Reads the table's
    latest commit, including commits made by other sessions and processes since this
    session last looked. On Spark Connect, which cannot reach the table's transactions, the
    answer is the batch of the latest commit marked with `app_id` (`commit_mark`) that the
    table's history still holds.

    Raises as `table_exists` does for a non-Delta catalog table.
    """
    if not table_exists(spark, ref):
        return None
    return flavour_of(spark).committed_batch(spark, ref.resolved(), app_id)


def prepare_append(spark: SparkSession, ref: TableRef) -> None:
    """Have Delta compute, ahead of an `append_once` to the existing table at `ref`, what its
    idempotent-write check reads (the table's reconstructed state), in this thread; nothing
    on Spark Connect, whose server runs the appends."""
    flavour_of(spark).prepare_append(spark, ref.resolved())


def compact(spark: SparkSession, ref: TableRef) -> tuple[int, int]:
    """Compact the small data files of the table at `ref` (Delta's OPTIMIZE, bin-packing).

    Rows are unchanged; only files change. Returns (files removed, files added). Raises
    Spark's `AnalysisException` when there is no such table, and Delta's concurrent
    modification errors when another writer's commit conflicts with the compaction.
    """
    result = spark.sql(f"OPTIMIZE {ref.resolved().sql_name}").first()
    metrics = result["metrics"] if result is not None else None
    if metrics is None:
        return 0, 0
    return int(metrics["numFilesRemoved"]), int(metrics["numFilesAdded"])


def update_where(
    spark: SparkSession, ref: TableRef, condition: str, set_values: Mapping[str, str]
) -> None:
    """Set columns of the rows of the table at `ref` that match `condition`, in one commit.

    `condition` is a SQL predicate; each value in `set_values` is a SQL expression. Raises
    Spark's `AnalysisException` when the table does not exist or the condition or a value
    does not resolve against its columns.
    """
    assignments = ", ".join(
        f"`{column.replace('`', '``')}` = {value}" for column, value in set_values.items()
    )
    spark.sql(f"UPDATE {ref.resolved().sql_name} SET {assignments} WHERE {condition}")


def sql_string(text: str) -> str:
    """`text` as a Spark SQL string literal (backslashes and quotes escaped)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def sql_timestamp(moment: datetime) -> str:
    """A Spark SQL timestamp literal for `moment` (naive datetimes are taken as UTC)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return f"TIMESTAMP'{moment.astimezone(UTC).isoformat()}'"
