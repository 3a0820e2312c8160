"""Tables checked against the checkpoint at the first batch of a run (`batch.table_checks`)."""

from __future__ import annotations

from retrylib.batch.table_checks import TableState, last_appends, manifest_tables, mismatch
from retrylib.config.table_ref import TableRef

OUTPUT = TableRef("/data/orders", is_path=True)
DEAD = TableRef("/data/dead", is_path=True)


def manifest(output_rows: int, dead_rows: int, output: TableRef = OUTPUT) -> dict:
    return {
        "rows": {"output": output_rows, "dead_letter": dead_rows, "staged": 3},
        "tables": manifest_tables({"output": output, "dead_letter": DEAD}),
    }


def test_the_last_append_of_each_kind_is_the_newest_manifest_with_rows_for_that_table() -> None:
    manifests = [(6, manifest(0, 0)), (5, manifest(0, 2)), (4, manifest(10, 1))]
    assert last_appends(manifests, {"output": OUTPUT, "dead_letter": DEAD}) == {
        "output": 4,
        "dead_letter": 5,
    }


def test_older_manifests_are_not_read_once_every_table_has_its_last_append() -> None:
    taken = []

    def newest_first():
        for batch_id in (9, 8, 7):
            taken.append(batch_id)
            yield batch_id, manifest(1, 1)

    assert last_appends(newest_first(), {"output": OUTPUT, "dead_letter": DEAD}) == {
        "output": 9,
        "dead_letter": 9,
    }
    assert taken == [9]


def test_a_manifest_of_another_table_or_naming_none_says_nothing() -> None:
    elsewhere = TableRef("/data/old_orders", is_path=True)
    old = {"rows": {"output": 5, "dead_letter": 0}}  # before manifests named their tables
    manifests = [(3, old), (4, manifest(10, 0, output=elsewhere))]
    assert last_appends(manifests, {"output": OUTPUT}) == {}


def test_a_relative_path_is_compared_resolved(monkeypatch, tmp_path) -> None:
    monkeypatch.chdir(tmp_path)
    relative = TableRef("./orders", is_path=True)
    written = manifest(1, 0, output=TableRef(str(tmp_path / "orders"), is_path=True))
    assert last_appends([(0, written)], {"output": relative}) == {"output": 0}


def test_a_table_holding_every_batch_that_appended_to_it_agrees() -> None:
    assert mismatch(TableState("output", OUTPUT, 7), "app", 9, 7) is None
    assert mismatch(TableState("output", OUTPUT, 9), "app", 9, 7) is None  # a replay
    assert mismatch(TableState("output", OUTPUT, None), "app", 0, None) is None  # new


def test_a_table_behind_the_checkpoint_is_named_with_what_it_lacks() -> None:
    error = mismatch(TableState("dead_letter", DEAD, None), "app", 3, 2)
    assert error is not None
    assert error.startswith("the dead-letter table /data/dead holds no batch of 'app', but ")
    assert "batch 2 of the checkpoint appended rows to it" in error
    assert "Restore the table's latest version" in error
    error = mismatch(TableState("output", OUTPUT, 1), "app", 3, 2)
    assert error is not None and "holds batches up to 1 of 'app'" in error


def test_a_table_ahead_of_the_checkpoint_is_named() -> None:
    error = mismatch(TableState("output", OUTPUT, 12), "app", 9, 8)
    assert error is not None
    assert "holds batch 12 of 'app', but the query is at batch 9" in error
