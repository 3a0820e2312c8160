"""`retrylib redrive` and `status` on Spark's Delta: the selection's condition on a real
dead-letter table, a dead-letter table named by a catalog name, and UPDATEs racing.

The command itself, on the table of a real job run and as its own process, is in
`test_cli.py`.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from chispa import assert_df_equality
from confluent_kafka.admin import AdminClient
from helpers import read_topic
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

import retrylib.sinks.dead_letter_table as table_module
from retrylib.config.table_ref import TableRef
from retrylib.config.topic_names import redriven_topic
from retrylib.errors import LeaseHeld, RedriveError
from retrylib.kafka.clients import ensure_topics
from retrylib.kafka.runner_lease import redrive_group, take_lease
from retrylib.ops.check import preflight
from retrylib.ops.redrive import PACED_SEND_S, Selection, redrive
from retrylib.ops.status import collect_status
from retrylib.sinks.dead_letter import DEAD_LETTER_SCHEMA
from retrylib.sinks.tables import append_once, ensure_table, read_table

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
DEAD_LETTER = from_arrow_schema(DEAD_LETTER_SCHEMA)


def add_dead_letters(spark, table: TableRef, rows: list[dict]) -> None:
    """Create the dead-letter table as the job does and append `rows` (missing columns null)."""
    ensure_table(spark, table, DEAD_LETTER, what="dead-letter")
    frame = spark.createDataFrame(rows, DEAD_LETTER).coalesce(1)
    append_once(frame, table, app_id=f"test-{uuid.uuid4().hex}", batch_id=0)


def chosen(spark, table: TableRef, selection: Selection) -> list[str]:
    """The ids of the rows a redrive of `selection` would claim, sorted."""
    frame = read_table(spark, table).where(
        selection.chosen(table_module.DeadLetterTable(spark, table))
    )
    return sorted(row.id for row in frame.select("id").collect())


@pytest.fixture(scope="module")
def selection_table(spark, tmp_path_factory) -> TableRef:
    table = TableRef.parse(str(tmp_path_factory.mktemp("selection") / "dlq"), "dead_letter.table")
    rows = [  # id, error class, dead-lettered at, redrive id, origin topic, partition, offset
        ("a", "builtins.ValueError", NOW - timedelta(hours=3), None, "orders", 0, 7),
        ("b", "builtins.ValueError", NOW - timedelta(hours=1), None, "orders", 1, 7),
        ("c", "shop.errors.PriceError", NOW - timedelta(minutes=5), None, "orders", 1, 9),
        ("d", "builtins.KeyError", NOW, "earlier-redrive", "orders", 1, 8),
        ("it's", "shop.NotAValueError", NOW, None, "returns", 1, 8),
        ("back\\slash", "builtins.KeyError", NOW, None, "orders", 1, 10),
    ]
    add_dead_letters(
        spark,
        table,
        [
            {
                "id": i,
                "error_class": c,
                "dead_lettered_at": at,
                "redrive_id": r,
                "origin_topic": topic,
                "origin_partition": partition,
                "origin_offset": offset,
                "key": f"key-{i}".encode(),
            }
            for i, c, at, r, topic, partition, offset in rows
        ],
    )
    return table


@pytest.mark.parametrize(
    "selection, ids",
    [
        (Selection(), ["a", "b", "back\\slash", "c", "it's"]),
        (Selection(since=NOW - timedelta(hours=1), until=NOW), ["b", "c"]),  # half-open
        (Selection(until=(NOW - timedelta(hours=2)).replace(tzinfo=None)), ["a"]),  # naive: UTC
        (Selection(error_classes=("ValueError",)), ["a", "b"]),  # not NotAValueError
        (Selection(error_classes=("shop.errors.PriceError", "KeyError")), ["back\\slash", "c"]),
        (Selection(ids=("it's", "back\\slash", "a")), ["a", "back\\slash", "it's"]),
        (Selection(topics=("returns",)), ["it's"]),
        (Selection(keys=("key-b", "key-c", "key-z")), ["b", "c"]),
        (Selection(topics=("orders",), partition=1, offsets=(8, 9)), ["c"]),  # d: claimed
        (Selection(partition=1), ["b", "back\\slash", "c", "it's"]),
        # The oldest first; rows dead-lettered at one time in id order.
        (Selection(limit=4), ["a", "b", "back\\slash", "c"]),
        (Selection(partition=1, limit=2), ["b", "c"]),
        (Selection(error_classes=("KeyError",), limit=5), ["back\\slash"]),
    ],
)
def test_the_selection_picks_rows_not_claimed(spark, selection_table, selection, ids):
    assert chosen(spark, selection_table, selection) == ids


def test_the_claim_update_takes_rows_out_of_later_selections(spark, tmp_path):
    table = TableRef.parse(str(tmp_path / "dlq"), "dead_letter.table")
    add_dead_letters(
        spark,
        table,
        [
            {"id": i, "error_class": c, "origin_topic": "orders"}
            for i, c in [("a", "builtins.ValueError"), ("b", "x.KeyError")]
        ],
    )
    dead = table_module.DeadLetterTable(spark, table)

    dead.update(
        Selection(error_classes=("ValueError",)).predicate(),
        {"redrive_id": "'r1'", "redrive_topic": "origin_topic"},
    )

    assert chosen(spark, table, Selection()) == ["b"]
    assert [(r["id"], r["redrive_topic"]) for r in dead.claimed()["r1"]] == [("a", "orders")]


def test_updates_racing_each_other_all_land(spark, tmp_path, monkeypatch):
    """Concurrent UPDATEs of one file conflict in Delta; each runs again until it lands.

    Rounds of three racing UPDATEs run until Delta reported a conflict at least once (the
    first round almost always does), so the retry path is known to have run.
    """
    table = TableRef.parse(str(tmp_path / "dlq"), "dead_letter.table")
    ids = [f"r{i}" for i in range(3)]
    add_dead_letters(spark, table, [{"id": i} for i in ids])
    conflicts: list[str] = []
    real_update = table_module.update_where

    def watched(*args, **kwargs):
        try:
            real_update(*args, **kwargs)
        except table_module.COMMIT_CONFLICTS as e:
            conflicts.append(type(e).__name__)
            raise

    monkeypatch.setattr(table_module, "update_where", watched)
    failures: list[BaseException] = []

    def claim(start: threading.Barrier, row_id: str, tag: str) -> None:
        start.wait()
        try:
            table_module.DeadLetterTable(spark, table).update(
                f"id = '{row_id}'", {"redrive_id": f"'{tag}'"}
            )
        except BaseException as e:
            failures.append(e)

    for round_ in range(5):
        start = threading.Barrier(len(ids))
        threads = [threading.Thread(target=claim, args=(start, i, f"{i}-{round_}")) for i in ids]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not failures, failures
        expected = spark.createDataFrame(
            [(i, f"{i}-{round_}") for i in ids], "id STRING, redrive_id STRING"
        )
        assert_df_equality(
            read_table(spark, table).select("id", "redrive_id"),
            expected,
            ignore_row_order=True,
            ignore_nullable=True,
        )
        if conflicts:
            break
    assert conflicts, "no round of racing UPDATEs conflicted"


def records_in(bootstrap: str, topic: str, partition: int) -> list[tuple[bytes, list]]:
    """(key, headers) of every committed record in `topic`[`partition`]."""
    return [
        (m.key(), m.headers() or [])
        for m in read_topic(bootstrap, topic)
        if m.partition() == partition
    ]


def test_status_and_redrive_with_a_catalog_table(
    spark, bootstrap_servers, make_topic, write_config
):
    """`dead_letter.table = "default.dlq_<uuid>"`: status counts it, redrive sends from it and
    marks it, check finds it. In-process: the test session's catalog is in memory, so a
    table made here is not visible to another process (see test_cli.py).
    """
    topic = make_topic("home", partitions=2)
    config = write_config([topic], name="catalogdlq")
    name = f"default.dlq_{uuid.uuid4().hex[:12]}"
    config = dataclasses.replace(
        config, dead_letter=dataclasses.replace(config.dead_letter, table=name)
    )
    table = TableRef.parse(name, "dead_letter.table")
    headers = [{"key": "trace", "value": b"t1"}, {"key": "retrylib.attempt", "value": b"3"}]
    add_dead_letters(
        spark,
        table,
        [
            {
                "id": f"id-{i}",
                "error_class": error_class,
                "origin_topic": topic,
                "origin_partition": 1,
                "origin_offset": i,
                "dead_lettered_at": NOW + timedelta(seconds=i),
                "key": f"k{i}".encode(),
                "value": b"v",
                "headers": headers,
            }
            for i, error_class in enumerate(
                ["builtins.ValueError", "builtins.ValueError", "shop.PriceError"]
            )
        ],
    )
    try:
        status = collect_status(config, spark=spark, timeout=5)
        dead = status["dead_letters"]
        assert (dead["table"], dead["exists"], dead["total"], dead["redriven"]) == (
            name,
            True,
            3,
            0,
        )
        assert [(c["error_class"], c["records"]) for c in dead["by_error_class"]] == [
            ("builtins.ValueError", 2),
            ("shop.PriceError", 1),
        ]

        # While another redrive of the job runs (here: holds its lease), one is refused
        # before it claims anything.
        admin = AdminClient({"bootstrap.servers": bootstrap_servers})
        control = redriven_topic(config.job.name)
        ensure_topics(admin, {control: 1}, create=True)
        held = take_lease(
            bootstrap_servers,
            {},
            admin,
            topic=control,
            group=redrive_group("catalogdlq"),
            what="redrive",
        )
        try:
            with pytest.raises(LeaseHeld, match=f"another copy holds .* pid={os.getpid()} "):
                redrive(config, Selection(error_classes=("ValueError",)), spark=spark)
        finally:
            held.release()
        assert read_table(spark, table).where("redrive_id IS NOT NULL").count() == 0

        with pytest.raises(RedriveError, match="'nosuchtopic' does not exist on .*; create it$"):
            redrive(config, Selection(error_classes=("ValueError",)), to="nosuchtopic", spark=spark)

        # In parts: the oldest first, then the next (a rate takes 10 minutes' worth a run).
        first = redrive(config, Selection(error_classes=("ValueError",), limit=1), spark=spark)
        report = redrive(
            config, Selection(error_classes=("ValueError",)), rate=1 / PACED_SEND_S, spark=spark
        )

        assert (first.sent, first.left, report.sent, report.left) == (1, 1, 1, 0)
        assert [row["id"] for row in first.selected + report.selected] == ["id-0", "id-1"]
        assert records_in(bootstrap_servers, topic, 1) == [
            (b"k0", [("trace", b"t1"), ("retrylib.redrives", b"1")]),
            (b"k1", [("trace", b"t1"), ("retrylib.redrives", b"1")]),
        ]
        marked = read_table(spark, table).select(
            "id",
            "redrive_id",
            "redrive_topic",
            F.col("redriven_at").isNotNull().alias("redriven"),
        )
        expected = spark.createDataFrame(
            [
                ("id-0", first.redrive_id, topic, True),
                ("id-1", report.redrive_id, topic, True),
                ("id-2", None, None, False),
            ],
            "id STRING, redrive_id STRING, redrive_topic STRING, redriven BOOLEAN",
        )
        assert_df_equality(marked, expected, ignore_row_order=True, ignore_nullable=True)
        dead = collect_status(config, spark=spark, timeout=5)["dead_letters"]
        assert (dead["total"], dead["redriven"], dead["waiting"]) == (3, 2, 1)
        again = redrive(config, Selection(error_classes=("ValueError",)), spark=spark)
        assert (again.sent, again.selected) == (0, [])

        _, findings = preflight(config, timeout=5, spark=spark, tables=True)
        assert f"ok: dead_letter.table: Delta table {name}" in {
            f"{f.level}: {f.message}" for f in findings
        }
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {name}")


def test_records_redriven_max_redrives_times_are_left_out_unless_again(
    spark, bootstrap_servers, make_topic, write_config, tmp_path
):
    """A record that came back to the dead letter after `max_redrives` redrives (its
    `retrylib.redrives` header) is counted and left out; `again` sends it too. Each send
    counts one more redrive."""
    topic = make_topic("loops", partitions=1)
    config = write_config([topic], name="loops")
    config = dataclasses.replace(
        config, dead_letter=dataclasses.replace(config.dead_letter, max_redrives=3)
    )
    redrives = {"new": None, "twice": b"2", "thrice": b"3", "unreadable": b"x"}
    add_dead_letters(
        spark,
        config.dead_letter.table_ref(),
        [
            {
                "id": key,
                "origin_topic": topic,
                "origin_partition": 0,
                "dead_lettered_at": NOW + timedelta(seconds=i),
                "key": key.encode(),
                "headers": [{"key": "trace", "value": b"t"}]
                + ([] if count is None else [{"key": "retrylib.redrives", "value": count}]),
            }
            for i, (key, count) in enumerate(redrives.items())
        ],
    )

    dry = redrive(config, Selection(), dry_run=True, spark=spark)
    report = redrive(config, Selection(), spark=spark)
    dead = collect_status(config, spark=spark, timeout=5)["dead_letters"]
    again = redrive(config, Selection(), again=True, spark=spark)

    assert (dry.looping, report.looping, again.looping) == (1, 1, 0)
    assert (dead["waiting"], dead["looping"]) == (1, 1)
    assert [row["id"] for row in report.selected] == ["new", "twice", "unreadable"]
    assert [row["id"] for row in again.selected] == ["thrice"]
    assert records_in(bootstrap_servers, topic, 0) == [
        (b"new", [("trace", b"t"), ("retrylib.redrives", b"1")]),
        (b"twice", [("trace", b"t"), ("retrylib.redrives", b"3")]),
        (b"unreadable", [("trace", b"t"), ("retrylib.redrives", b"1")]),
        (b"thrice", [("trace", b"t"), ("retrylib.redrives", b"4")]),
    ]


def test_a_missing_catalog_table_has_nothing_to_redrive(spark, write_config, make_topic):
    config = write_config([make_topic("home", partitions=1)], name="nodlq")
    name = f"default.absent_{uuid.uuid4().hex[:12]}"
    config = dataclasses.replace(
        config, dead_letter=dataclasses.replace(config.dead_letter, table=name)
    )

    report = redrive(config, Selection(), spark=spark)

    assert (report.sent, report.selected, report.redrive_id) == (0, [], None)
    assert collect_status(config, spark=spark, timeout=5)["dead_letters"]["exists"] is False
