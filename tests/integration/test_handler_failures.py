"""A misbehaving handler is a failed attempt, never a crashed or stalled job, never a lost record.

Hanging past `[handler] timeout`, raising SystemExit or KeyboardInterrupt, catching the
timeout and carrying on: each counts as one failed attempt with a clear reason, is retried,
and dead-letters once out of attempts. Returning something that is not a row, or a row that
does not fit the output schema, dead-letters at once as `bad_handler_result`. (Handlers:
tests/integration/handlers/job_handlers.py.)
"""

from __future__ import annotations

import time

from chispa import assert_df_equality
from helpers import produce, read_table, run_until, settled_count

from retrylib.batch.result import BatchResult
from retrylib.config.loader import load_config

TIMEOUT_MS = 2_000
RECOVERING = ("exit", "hang", "interrupt", "swallow")
"""Prefixes whose handler misbehaves on attempt 0 only, and succeeds on attempt 1."""
BAD_RESULTS = ("schema", "badtype", "unknowncol")
"""Prefixes whose handler returns a bad result on attempt 0 (and would succeed on 1)."""


def test_misbehaving_handlers_fail_attempts_and_recover(
    spark, bootstrap_servers, make_topic, write_config, tmp_path
):
    topic = make_topic("orders", partitions=2)
    keys = [f"ok-{i}" for i in range(20)] + [f"{prefix}-0" for prefix in RECOVERING]
    keys += [f"{prefix}-0" for prefix in BAD_RESULTS]
    keys += ["exitalways-0", "hangalways-0"]
    produce(bootstrap_servers, topic, [(k, f"v-{k}") for k in keys], partitions=2)
    write_config([topic])
    config = load_config(tmp_path / "itest.toml", overrides={"handler.timeout": "2s"})
    assert config.handler.timeout_ms == TIMEOUT_MS

    started = time.monotonic()
    results = run_until(spark, config, lambda: settled_count(config) >= len(keys), timeout=150)
    elapsed = time.monotonic() - started

    attempt = {"ok": 0, **{prefix: 1 for prefix in RECOVERING}}
    succeeding = [k for k in keys if k.split("-")[0] in attempt]
    expected = spark.createDataFrame(
        [(k, f"v-{k}", topic, attempt[k.split("-")[0]]) for k in succeeding],
        "key STRING, value STRING, topic STRING, attempt INT",
    )
    output = read_table(config.output.table).to_pylist()
    actual = spark.createDataFrame(
        [(r["key"], r["value"], r["topic"], r["attempt"]) for r in output],
        "key STRING, value STRING, topic STRING, attempt INT",
    )
    assert_df_equality(actual, expected, ignore_row_order=True)

    dead = {row["key"].decode(): row for row in read_table(config.dead_letter.table).to_pylist()}
    assert sorted(dead) == sorted(
        ["exitalways-0", "hangalways-0", "schema-0", "badtype-0", "unknowncol-0"]
    )
    for prefix in BAD_RESULTS:
        row = dead[f"{prefix}-0"]
        assert (row["attempts"], row["reason"]) == (1, "bad_handler_result"), row
    exited, hung = dead["exitalways-0"], dead["hangalways-0"]
    assert (exited["attempts"], exited["reason"]) == (3, "attempts_exhausted")
    assert exited["error_class"] == "retrylib.handler.HandlerRaisedBaseException"
    assert exited["error_message"] == "handler raised SystemExit: always exits"
    assert (hung["attempts"], hung["reason"]) == (3, "attempts_exhausted")
    assert hung["error_class"] == "retrylib.handler.HandlerTimeout"
    assert hung["error_message"] == "handler did not return within 2s"

    # Not stalled: the ok records landed in the first batch, and the whole run took about
    # what the timeouts and delays cost (7 timeouts of 2s, delays of 1s and 2s), not 60s a hang.
    first = results[0]
    assert first.counters.get("succeeded", 0) >= 20, first.counters
    assert elapsed < 100, f"took {elapsed:.0f}s"
    failures = sum(v for k, v in _merged(results).items() if k.startswith("retried_tier_"))
    assert failures == len(RECOVERING) + 4  # each recovering once, the two permanent twice


def test_failure_reasons_are_recorded(spark, bootstrap_servers, make_topic, write_config, tmp_path):
    """With one attempt only, every misbehaviour dead-letters at once, naming what happened."""
    topic = make_topic("orders", partitions=1)
    prefixes = ("exit", "interrupt", "hang", "schema", "badtype", "unknowncol", "nullkey")
    keys = [f"{prefix}-0" for prefix in prefixes]
    produce(bootstrap_servers, topic, [(k, "v") for k in keys])
    write_config([topic], retry={"delays": ["1s"], "max_attempts": 1})
    from job_handlers import OUTPUT_SCHEMA  # on sys.path via write_config

    not_null_key = OUTPUT_SCHEMA.replace("key STRING", "key STRING NOT NULL", 1)
    config = load_config(
        tmp_path / "itest.toml",
        overrides={"handler.timeout": "2s", "handler.output_schema": not_null_key},
    )

    run_until(spark, config, lambda: settled_count(config) >= len(keys), timeout=150)

    assert read_table(config.output.table).num_rows == 0
    dead = {r["key"].decode(): r for r in read_table(config.dead_letter.table).to_pylist()}
    reasons = {
        key: (row["error_class"].rsplit(".", 1)[-1], row["error_message"])
        for key, row in dead.items()
    }
    assert reasons["exit-0"] == ("HandlerRaisedBaseException", "handler raised SystemExit: 3")
    assert reasons["interrupt-0"] == (
        "HandlerRaisedBaseException",
        "handler raised KeyboardInterrupt",
    )
    assert reasons["hang-0"] == ("HandlerTimeout", "handler did not return within 2s")
    assert reasons["schema-0"][0] == "BadHandlerResult"
    assert reasons["schema-0"][1].startswith("rows do not fit the output schema")
    assert reasons["badtype-0"] == (
        "BadHandlerResult",
        "handler returned str; return a dict, a list of dicts or None",
    )
    assert reasons["unknowncol-0"][0] == "BadHandlerResult"
    assert "['no_such_column']" in reasons["unknowncol-0"][1]
    assert reasons["nullkey-0"] == (
        "BadHandlerResult",
        "rows do not fit the output schema: column 'key' is NOT NULL, but a row has no value "
        "for it",
    )
    assert all(row["attempts"] == 1 for row in dead.values())
    bad_results = {"schema-0", "badtype-0", "unknowncol-0", "nullkey-0"}
    assert {key: row["reason"] for key, row in dead.items()} == {
        key: "bad_handler_result" if key in bad_results else "attempts_exhausted" for key in dead
    }


def _merged(results: list[BatchResult]) -> dict[str, int]:
    merged: dict[str, int] = {}
    for result in results:
        for key, value in result.counters.items():
            merged[key] = merged.get(key, 0) + value
    return merged
