"""`retrylib.sinks.tables` against real Delta tables, by path and by catalog name, in local Spark:
each test through the tests' classic session and through a Spark Connect client of the
run's Connect server, unless it names one.

Transactions are checked where Delta keeps them: the `txn` action of each commit file in the
table's `_delta_log`, read as plain JSON.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from chispa import assert_df_equality
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructField, StructType

from retrylib.batch.at_once import Started
from retrylib.config.table_ref import TableRef
from retrylib.errors import RetrylibError
from retrylib.sinks.tables import (
    append_once,
    committed_version,
    ensure_table,
    prepare_append,
    read_table,
    table_exists,
    update_where,
)

ORDERS = "id BIGINT, part STRING, total DOUBLE"
CLASSIC_ONLY = pytest.mark.parametrize("spark", ["classic"], indirect=True)


@pytest.fixture(params=["classic", pytest.param("connect", marks=pytest.mark.every_spark)])
def spark(
    request: pytest.FixtureRequest, spark: SparkSession, monkeypatch: pytest.MonkeyPatch
) -> SparkSession:
    """The tests' classic session, or a Spark Connect client of the run's server (PySpark's
    functions then build Connect columns, as in a process that runs through Connect)."""
    if request.param == "classic":
        return spark
    monkeypatch.setenv("SPARK_CONNECT_MODE_ENABLED", "1")
    return request.getfixturevalue("connect_spark")


@pytest.fixture(scope="module")
def connect_spark(connect_server: str) -> Iterator[SparkSession]:
    """A Spark Connect client of the run's server, closed before the server stops."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    session = ConnectSession.builder.remote(connect_server).getOrCreate()
    yield session
    session.stop()


def schema(spark: SparkSession, ddl: str) -> StructType:
    return spark.createDataFrame([], ddl).schema


def rows(spark: SparkSession, data: list[tuple], ddl: str = ORDERS) -> DataFrame:
    return spark.createDataFrame(data, ddl)


def commits(table_dir: Path) -> dict[int, dict[str, list[dict]]]:
    """Each commit of the table's log: version -> action name -> the actions of that kind."""
    found: dict[int, dict[str, list[dict]]] = {}
    for path in sorted((table_dir / "_delta_log").glob("*.json")):
        actions: dict[str, list[dict]] = {}
        for line in path.read_text().splitlines():
            for name, action in json.loads(line).items():
                actions.setdefault(name, []).append(action)
        found[int(path.stem)] = actions
    return found


def txns(table_dir: Path) -> dict[int, list[tuple[str, int]]]:
    """version -> the (appId, version) of each `txn` action its commit carries."""
    return {
        version: [(txn["appId"], txn["version"]) for txn in actions.get("txn", [])]
        for version, actions in commits(table_dir).items()
    }


def detail(spark: SparkSession, ref: TableRef) -> dict:
    target = ref.resolved()
    name = f"delta.`{target.text}`" if target.is_path else target.text
    return spark.sql(f"DESCRIBE DETAIL {name}").first().asDict()


def location(spark: SparkSession, ref: TableRef) -> Path:
    return Path(detail(spark, ref)["location"].removeprefix("file:"))


@pytest.fixture
def orders(spark: SparkSession, tmp_path: Path) -> TableRef:
    """An empty path table of ORDERS."""
    ref = TableRef.parse(str(tmp_path / "orders"), "output.table")
    ensure_table(spark, ref, schema(spark, ORDERS), what="output")
    return ref


@pytest.fixture
def catalog_name(spark: SparkSession) -> Iterator[str]:
    """A fresh name in the session catalog's default database, dropped afterwards."""
    name = f"default.orders_{uuid.uuid4().hex[:10]}"
    yield name
    spark.sql(f"DROP TABLE IF EXISTS {name}")


def test_a_new_table_gets_partitions_and_properties(spark: SparkSession, tmp_path: Path) -> None:
    ref = TableRef.parse(str(tmp_path / "orders"), "output.table")
    assert not table_exists(spark, ref)
    properties = {"delta.appendOnly": "true", "retrylib.table": "output"}

    ensure_table(
        spark,
        ref,
        schema(spark, ORDERS),
        what="output",
        partition_by=["part"],
        properties=properties,
    )

    assert table_exists(spark, ref)
    info = detail(spark, ref)
    assert info["format"] == "delta"
    assert info["partitionColumns"] == ["part"]
    assert info["properties"] == properties
    assert read_table(spark, ref).schema == schema(spark, ORDERS)
    ensure_table(spark, ref, schema(spark, ORDERS), what="output", partition_by=["part"])
    assert sorted(commits(tmp_path / "orders")) == [0], "a second ensure_table commits nothing"


def test_a_relative_path_is_taken_from_the_current_directory(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    ref = TableRef.parse("./tables/orders", "output.table")

    ensure_table(spark, ref, schema(spark, ORDERS), what="output")
    assert append_once(rows(spark, [(1, "a", 1.0)]), ref, app_id="job", batch_id=0)

    assert (tmp_path / "tables" / "orders" / "_delta_log").is_dir()
    assert committed_version(spark, ref, "job") == 0
    assert read_table(spark, ref).count() == 1


def test_a_partition_column_outside_the_schema_is_refused(
    spark: SparkSession, tmp_path: Path
) -> None:
    ref = TableRef.parse(str(tmp_path / "orders"), "output.table")
    with pytest.raises(
        RetrylibError,
        match=r"output table .*/orders: partition column\(s\) day not in the schema "
        r"\(columns: id, part, total\)",
    ):
        ensure_table(spark, ref, schema(spark, ORDERS), what="output", partition_by=["part", "day"])
    assert not table_exists(spark, ref)


def test_other_columns_are_refused_naming_each_difference(
    spark: SparkSession, orders: TableRef
) -> None:
    wanted = schema(spark, "ID BIGINT, total STRING, note STRING")
    with pytest.raises(RetrylibError) as refused:
        ensure_table(spark, orders, wanted, what="output")
    assert str(refused.value) == (
        f"output table {orders} differs from the config: "
        "missing columns (in the config, not in the table): note STRING; "
        "extra columns (in the table, not in the config): part STRING; "
        "column total: table has DOUBLE, config has STRING. "
        "Point the config at a new table, or migrate this one (ALTER TABLE)"
    )
    # Nullability alone is no difference.
    not_null = StructType([StructField(f.name, f.dataType, False) for f in schema(spark, ORDERS)])
    ensure_table(spark, orders, not_null, what="output")


def test_evolve_adds_new_columns_on_append_and_refuses_type_changes(
    spark: SparkSession, orders: TableRef
) -> None:
    wider = "id BIGINT, part STRING, total DOUBLE, note STRING"
    append_once(rows(spark, [(1, "a", 1.0)]), orders, app_id="job", batch_id=0)
    with pytest.raises(
        RetrylibError, match=r"or enable schema evolution for it to add the missing columns$"
    ):
        ensure_table(spark, orders, schema(spark, wider), what="output")

    ensure_table(spark, orders, schema(spark, wider), what="output", evolve=True)
    assert "note" not in read_table(spark, orders).columns, "columns come with the first append"
    new_rows = rows(spark, [(2, "b", 2.0, "new")], wider)
    assert append_once(new_rows, orders, app_id="job", batch_id=1, evolve=True)

    expected = rows(spark, [(1, "a", 1.0, None), (2, "b", 2.0, "new")], wider)
    assert_df_equality(read_table(spark, orders), expected, ignore_row_order=True)
    ensure_table(spark, orders, schema(spark, wider), what="output")
    retyped = schema(spark, "id BIGINT, part STRING, total STRING, note STRING")
    with pytest.raises(RetrylibError, match=r"column total: table has DOUBLE, config has STRING"):
        ensure_table(spark, orders, retyped, what="output", evolve=True)


def test_append_once_commits_each_batch_of_each_app_once(
    spark: SparkSession, orders: TableRef
) -> None:
    table_dir = location(spark, orders)
    assert committed_version(spark, orders, "job") is None

    assert append_once(rows(spark, [(1, "a", 1.0)]), orders, app_id="job", batch_id=0)
    assert not append_once(rows(spark, [(9, "x", 9.0)]), orders, app_id="job", batch_id=0)
    assert append_once(rows(spark, [(2, "b", 2.0)]), orders, app_id="job", batch_id=2)
    assert not append_once(rows(spark, [(8, "x", 8.0)]), orders, app_id="job", batch_id=1)
    assert append_once(rows(spark, [(3, "c", 3.0)]), orders, app_id="other", batch_id=0)

    expected = rows(spark, [(1, "a", 1.0), (2, "b", 2.0), (3, "c", 3.0)])
    assert_df_equality(read_table(spark, orders), expected, ignore_row_order=True)
    assert txns(table_dir) == {0: [], 1: [("job", 0)], 2: [("job", 2)], 3: [("other", 0)]}
    assert committed_version(spark, orders, "job") == 2
    assert committed_version(spark, orders, "other") == 0
    assert committed_version(spark, orders, "nobody") is None


def test_an_empty_append_commits_its_transaction(spark: SparkSession, orders: TableRef) -> None:
    table_dir = location(spark, orders)

    assert append_once(rows(spark, []), orders, app_id="job", batch_id=4)
    assert not append_once(rows(spark, []), orders, app_id="job", batch_id=4)

    assert txns(table_dir) == {0: [], 1: [("job", 4)]}
    assert "add" not in commits(table_dir)[1]
    assert committed_version(spark, orders, "job") == 4
    assert read_table(spark, orders).count() == 0


@CLASSIC_ONLY  # a Connect client tells the job's commits by their userMetadata, not their txn
def test_committed_version_sees_a_commit_made_outside_this_session(
    spark: SparkSession, orders: TableRef
) -> None:
    table_dir = location(spark, orders)
    append_once(rows(spark, [(1, "a", 1.0)]), orders, app_id="job", batch_id=0)
    assert committed_version(spark, orders, "job") == 0

    # Another writer's commit, as Delta writes it: the next version's file in the log.
    now = int(time.time() * 1000)
    actions = [
        {"commitInfo": {"timestamp": now, "operation": "WRITE", "operationParameters": {}}},
        {"txn": {"appId": "job", "version": 7, "lastUpdated": now}},
    ]
    (table_dir / "_delta_log" / f"{2:020d}.json").write_text(
        "".join(json.dumps(action) + "\n" for action in actions)
    )

    assert committed_version(spark, orders, "job") == 7
    assert not append_once(rows(spark, [(9, "x", 9.0)]), orders, app_id="job", batch_id=7)
    assert append_once(rows(spark, [(2, "b", 2.0)]), orders, app_id="job", batch_id=8)
    assert txns(table_dir)[3] == [("job", 8)]


@CLASSIC_ONLY  # a Connect client reads the history instead (commit_mark)
def test_committed_version_is_read_from_the_checksum_without_a_spark_job(
    spark: SparkSession, orders: TableRef
) -> None:
    """Reconstructing the table's state for its transactions costs Spark jobs per new version,
    run beside the routing tasks; the checksum file Delta writes with each version holds
    them. A damaged checksum file leaves the answer to the state, still right."""
    table_dir = location(spark, orders)
    for batch in (0, 1, 2):
        append_once(rows(spark, [(batch, "a", 1.0)]), orders, app_id="job", batch_id=batch)
    tracker = spark.sparkContext.statusTracker()
    jobs_before = len(tracker.getJobIdsForGroup())

    assert committed_version(spark, orders, "job") == 2
    assert committed_version(spark, orders, "nobody") is None
    assert len(tracker.getJobIdsForGroup()) == jobs_before

    (table_dir / "_delta_log" / f"{3:020d}.crc").write_text("{not json")
    spark._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()  # read from the files again
    assert committed_version(spark, orders, "job") == 2


@CLASSIC_ONLY  # on Spark Connect the server runs the appends: nothing to prepare here
def test_an_append_finds_the_state_its_check_reads_once_prepared(
    spark: SparkSession, orders: TableRef
) -> None:
    """Delta's idempotent-write check reconstructs the table's state, Spark jobs run inside
    the append, unless `prepare_append` computed it ahead (beside the batch's routing)."""
    tracker = spark.sparkContext.statusTracker()

    def jobs_run(call: Callable[[], object]) -> int:
        before = len(tracker.getJobIdsForGroup())
        call()
        return len(tracker.getJobIdsForGroup()) - before

    append_once(rows(spark, [(0, "a", 1.0)]), orders, app_id="job", batch_id=0)
    inline = jobs_run(
        lambda: append_once(rows(spark, [(1, "a", 1.0)]), orders, app_id="job", batch_id=1)
    )
    prepared = jobs_run(lambda: prepare_append(spark, orders))
    appended = jobs_run(
        lambda: append_once(rows(spark, [(2, "a", 1.0)]), orders, app_id="job", batch_id=2)
    )

    assert prepared >= 1 and appended < inline, (inline, prepared, appended)
    assert committed_version(spark, orders, "job") == 2


@CLASSIC_ONLY  # a Connect client has no side in the JVM
def test_a_thread_the_batch_starts_has_the_session_active(spark: SparkSession) -> None:
    """Delta computes some reads with the JVM thread's active session (a table state it lost
    to a concurrent OPTIMIZE is computed again there, else DELTA_SPARK_SESSION_NOT_SET): the
    batch reads its tables in threads of its own (`Started`)."""

    def active() -> bool:
        return spark._jvm.SparkSession.getActiveSession().isDefined()

    assert Started(spark, active).result()


def test_a_catalog_table_works_like_a_path_table(spark: SparkSession, catalog_name: str) -> None:
    ref = TableRef.parse(catalog_name, "output.table")
    assert not ref.is_path
    assert not table_exists(spark, ref)
    assert committed_version(spark, ref, "job") is None

    ensure_table(spark, ref, schema(spark, ORDERS), what="output", partition_by=["part"])
    assert append_once(rows(spark, [(1, "a", 1.0)]), ref, app_id="job", batch_id=3)
    assert not append_once(rows(spark, [(9, "x", 9.0)]), ref, app_id="job", batch_id=3)
    assert append_once(rows(spark, [(2, "b", 2.0)]), ref, app_id="job", batch_id=4)

    assert table_exists(spark, ref)
    info = detail(spark, ref)
    assert (info["format"], info["partitionColumns"]) == ("delta", ["part"])
    assert txns(location(spark, ref)) == {0: [], 1: [("job", 3)], 2: [("job", 4)]}
    assert committed_version(spark, ref, "job") == 4
    expected = rows(spark, [(1, "a", 1.0), (2, "b", 2.0)])
    assert_df_equality(read_table(spark, ref), expected, ignore_row_order=True)
    # The same table under its three-part, backquoted name.
    database, table = catalog_name.split(".")
    three_parts = TableRef.parse(f"spark_catalog.`{database}`.`{table}`", "output.table")
    assert committed_version(spark, three_parts, "job") == 4

    update_where(spark, ref, "id = 2", {"total": "20.0", "part": "'z'"})
    expected = rows(spark, [(1, "a", 1.0), (2, "z", 20.0)])
    assert_df_equality(read_table(spark, three_parts), expected, ignore_row_order=True)


def test_update_where_sets_matching_rows_of_a_path_table(
    spark: SparkSession, orders: TableRef
) -> None:
    append_once(rows(spark, [(1, "a", 1.0), (2, "b", 2.0)]), orders, app_id="job", batch_id=0)

    update_where(spark, orders, "part = 'b'", {"total": "total * 10"})

    expected = rows(spark, [(1, "a", 1.0), (2, "b", 20.0)])
    assert_df_equality(read_table(spark, orders), expected, ignore_row_order=True)
    assert committed_version(spark, orders, "job") == 0


def test_a_catalog_table_that_is_not_delta_is_refused(
    spark: SparkSession, catalog_name: str
) -> None:
    spark.sql(f"CREATE TABLE {catalog_name} (id BIGINT) USING parquet")
    ref = TableRef.parse(catalog_name, "output.table")
    with pytest.raises(RetrylibError, match=r"is a parquet table, not a Delta table"):
        table_exists(spark, ref)
    with pytest.raises(RetrylibError, match=r"is a parquet table, not a Delta table"):
        ensure_table(spark, ref, schema(spark, "id BIGINT"), what="output")


def test_append_once_needs_an_existing_table_and_a_batch_id_delta_accepts(
    spark: SparkSession, tmp_path: Path, orders: TableRef
) -> None:
    missing = TableRef.parse(str(tmp_path / "missing"), "output.table")
    with pytest.raises(AnalysisException, match="DELTA_MISSING_DELTA_TABLE|is not a Delta table"):
        append_once(rows(spark, [(1, "a", 1.0)]), missing, app_id="job", batch_id=0)
    assert not (tmp_path / "missing").exists()
    with pytest.raises(ValueError, match=r"batch_id must be >= 0, got -1"):
        append_once(rows(spark, [(1, "a", 1.0)]), orders, app_id="job", batch_id=-1)
