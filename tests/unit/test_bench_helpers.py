"""The benchmark's pure helpers (bench/): input marking, numbers and tables, /proc parsing."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow as pa
import pytest

# bench/ is not an installed package: import it from the repository root, as its README does.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import outside
from bench.bare_driver import per_record
from bench.data import make_value, marked_to_fail, soak_mark
from bench.handlers import DEAD_MARK, FAIL_MARK, OK_MARK, BenchPoisonError, flaky, soak, trivial
from bench.instrument import _add_counters
from bench.procmem import (
    classify,
    cpu_between,
    descendants,
    machine_busy_seconds,
    parse_kb,
    parse_stat,
)
from bench.report import (
    failure_cause,
    fmt,
    heap_figures,
    lateness_ms,
    percentile,
    rate,
    ratio,
    sum_counters,
    table,
    trend,
)
from bench.soak import JobLog, heap_used_mb, process_role
from bench.spy_summary import charge, parse_line, role
from retrylib.record import Record


@pytest.mark.parametrize("rate_", [0.0, 0.05, 0.1, 0.333, 1.0])
def test_marked_share_is_exact_in_every_prefix(rate_):
    for n in (1, 19, 20, 1000):
        marked = sum(marked_to_fail(i, rate_) for i in range(n))
        assert marked == int(n * rate_)


def test_values_have_the_asked_size_and_marker():
    assert len(make_value(123, 200, True)) == 200
    assert make_value(123, 200, True)[:1] == FAIL_MARK
    assert make_value(5, 200, False)[:1] == OK_MARK
    assert len(make_value(123456, 3, False)) == 3


def record(value: bytes, attempt: int = 0) -> Record:
    return Record(b"k", value, [], "t", 1, 7, 0, attempt)


def test_flaky_fails_a_marked_record_only_on_its_first_delivery():
    with pytest.raises(Exception, match="marked"):
        flaky(record(FAIL_MARK + b"x"))
    assert flaky(record(FAIL_MARK + b"x", attempt=1)) == {"partition": 1, "offset": 7, "size": 2}
    assert trivial(record(FAIL_MARK + b"x")) == {"partition": 1, "offset": 7, "size": 2}


def test_percentile_interpolates_between_ranks():
    assert percentile([], 50) is None
    assert percentile([5], 99) == 5
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile(list(range(101)), 99) == 99
    assert percentile([10, 0], 100) == 10


def test_rates_and_ratios_tolerate_missing_numbers():
    assert rate(100, 2.0) == 50
    assert rate(100, 0) is None
    assert ratio(3.0, None) is None
    assert ratio(3.0, 2.0) == 1.5


def test_fmt_and_table():
    assert fmt(None) == "-"
    assert fmt(1234567) == "1,234,567"
    assert fmt(2.345, 2) == "2.35"
    text = table(["name", "n"], [["a", 1000], ["bb", 5]], "title")
    lines = text.splitlines()
    assert lines[0] == "title"
    assert lines[1] == "| name | n     |"
    assert lines[3] == "| a    | 1,000 |"
    assert lines[4] == "| bb   |     5 |"


def test_sum_counters_adds_per_key():
    batches = [{"counters": {"a": 1, "b": 2}}, {"counters": {"a": 3}}, {}]
    assert sum_counters(batches) == {"a": 4, "b": 2}


def test_lateness_pairs_records_by_origin():
    handled = {(0, 1): 1500, (0, 2): 2100}
    due = {(0, 1): 1000, (0, 2): 2000, (1, 5): 3000}
    values, missing = lateness_ms(handled, due)
    assert sorted(values) == [100, 500]
    assert missing == 1


def test_parse_stat_survives_odd_command_names():
    fields = ["S", "42"] + ["0"] * 9 + ["250", "150"] + ["0"] * 30
    comm, ppid, cpu = parse_stat("123 (we(ird) name) " + " ".join(fields))
    assert (comm, ppid) == ("we(ird) name", 42)
    assert cpu == pytest.approx(400 / __import__("os").sysconf("SC_CLK_TCK"))


def test_parse_kb_and_machine_busy():
    assert parse_kb("Rss:   1732 kB\nPss:    226 kB\n", "Pss") == 226
    assert parse_kb("Rss: 1 kB", "Pss") is None
    ticks = __import__("os").sysconf("SC_CLK_TCK")
    stat = "cpu  100 10 50 1000 20 5 5 10 0 0\ncpu0 1 1 1 1 1 1 1 1 0 0\n"
    assert machine_busy_seconds(stat) == pytest.approx(180 / ticks)


def test_process_tree_and_groups():
    parents = {1: 0, 10: 1, 11: 10, 12: 11, 20: 1}
    assert descendants(10, parents) == {10, 11, 12}
    assert classify(10, 10, "python") == "driver"
    assert classify(11, 10, "java") == "jvm"
    assert classify(12, 10, "python3") == "workers"
    before = {"jvm": {11: 1.0}, "workers": {12: 2.0}}
    after = {"jvm": {11: 3.5}, "workers": {12: 2.5, 13: 1.0}}
    assert cpu_between(before, after) == {"jvm": 2.5, "workers": 1.5}


def test_timers_are_added_to_the_counters_row():
    schema = pa.schema([("kind", pa.string()), ("counters", pa.string())])
    summary = pa.RecordBatch.from_pylist(
        [{"kind": "output", "counters": None}, {"kind": "counters", "counters": '{"a": 1}'}],
        schema=schema,
    )
    rows = _add_counters(summary, {"a": 2, "bench_x": 5}).to_pylist()
    assert rows[0] == {"kind": "output", "counters": None}
    assert json.loads(rows[1]["counters"]) == {"a": 3, "bench_x": 5}


def test_spy_lines_are_put_in_roles_and_charged_to_our_frames():
    line = (
        'process 1:"python -m bench.retrylib_driver";process 2:"python -m pyspark.daemon";'
        "main (worker.py:1);run_task (retrylib/task/routing.py:372);"
        "record_id (retrylib/retry/headers.py:92);dumps (json/__init__.py:234) 7"
    )
    frames, count = parse_line(line)
    assert count == 7
    assert role(frames) == "routing task (mapInArrow)"
    assert charge(frames) == "record_id (retrylib/retry/headers.py)"
    assert parse_line("") is None


def test_lateness_splits_at_the_trigger_that_handled_the_record():
    from bench.report import split_lateness

    handled = {(0, 1): 5_300, (0, 2): 9_100, (0, 3): 100}
    due = {(0, 1): 4_000, (0, 2): 8_000, (0, 3): 50}
    waits, inside = split_lateness(handled, due, [3_000, 5_000, 9_000])
    assert waits == [1_000, 1_000]
    assert inside == [300, 100]


def test_batch_ends_and_steady_rate_from_query_progress():
    from bench.report import batch_ends, steady_rate

    progress = [
        {
            "batchId": 0,
            "timestamp": "2026-01-01T00:00:00.000Z",
            "durationMs": {"triggerExecution": 9000},
        },
        {
            "batchId": 1,
            "timestamp": "2026-01-01T00:00:09.100Z",
            "durationMs": {"triggerExecution": 1900},
        },
        {"batchId": None, "timestamp": None},
    ]
    ends = batch_ends(progress)
    assert ends[1] - ends[0] == pytest.approx(2.0)
    assert steady_rate([(ends[0], 500), (ends[1], 1000)]) == pytest.approx(500.0)
    assert steady_rate([(ends[0], 500)]) is None


def test_full_batch_rate_leaves_out_a_small_tail_batch():
    from bench.report import full_batch_rate

    assert full_batch_rate([(1000, 2.0), (1000, 2.0), (16, 1.5)]) == pytest.approx(500.0)
    assert full_batch_rate([]) is None


def test_soak_marks_spread_dead_letters_and_failures():
    marks = [soak_mark(i, 0.05, 0.002) for i in range(10_000)]
    assert marks.count(DEAD_MARK) == 20
    assert 480 <= marks.count(FAIL_MARK) <= 500
    assert marks.count(OK_MARK) == 10_000 - marks.count(DEAD_MARK) - marks.count(FAIL_MARK)


def test_soak_handler_fails_dead_marks_always_and_fail_marks_once():
    with pytest.raises(BenchPoisonError):
        soak(record(DEAD_MARK + b"1:xx", attempt=5))
    with pytest.raises(Exception, match="marked to fail once"):
        soak(record(FAIL_MARK + b"1:xx"))
    assert soak(record(FAIL_MARK + b"1:xx", attempt=1))["size"] == 5


@pytest.mark.parametrize(
    ("values", "verdict"),
    [
        ([100, 300, 500, 505, 498, 502], "flat"),  # warm-up then steady
        ([1, 20, 10, 30, 5, 25], "bounded"),  # a saw-tooth
        ([6, 1, 1, 3, 7, 1], "bounded"),  # files between compactions: back down to 1
        ([3, 6, 7, 11, 11, 11], "bounded"),  # reached its cap
        ([100, 200, 300, 400, 500, 600], "growing"),
        ([5, 5, 0, 0, 0, 0], "flat"),
        ([1, 2, 3, 4, 5, None], "-"),
        ([1, 2], "-"),
    ],
)
def test_trend_compares_the_last_third_with_the_middle_third(values, verdict):
    assert trend(values) == verdict


@pytest.mark.parametrize(
    ("comm", "cmdline", "expected"),
    [
        ("java", "/usr/bin/java -cp x org.apache.spark.deploy.SparkSubmit", "jvm"),
        ("python", "/w/.venv/bin/python /w/jobs/run_job.py soak.toml", "driver"),
        ("python3", "/w/.venv/bin/python -m pyspark.daemon", "workers"),
        ("python", "python -m pyspark.sql.streaming.python_streaming_source_runner", "source"),
        ("bash", "bash /w/spark-submit.sh soak.toml", None),
    ],
)
def test_soak_groups_the_jobs_processes(comm, cmdline, expected):
    assert process_role(comm, cmdline) == expected


def test_soak_sums_the_jobs_metrics_lines_as_they_come(tmp_path):
    path = tmp_path / "job.log"
    line = "2026-11-23 10:00:00,000 INFO retrylib.metrics: " + json.dumps(
        {"batch_id": 1, "duration_ms": 1500, "records_main": 10, "succeeded": 9}
    )
    path.write_text(line + "\n" + "x INFO retrylib.sinks.compaction: compacted the output table\n")
    log = JobLog(path)
    assert log.read() == [1500]
    with open(path, "a") as f:
        f.write(line.replace('"batch_id": 1', '"batch_id": 2') + "\n" + line[:30])
    assert log.read() == [1500]  # the half-written line waits for the next read
    assert (log.batches, log.compactions, log.totals["records_main"]) == (2, 1, 20)


def test_soak_reads_the_heap_in_use_from_jcmd():
    text = (
        "12345:\n garbage-first heap   total 262144K, used 102400K [0x0, 0x0)\n"
        "  region size 1024K, 10 young (10240K), 2 survivors (2048K)\n"
        " Metaspace       used 90000K, committed 91000K, reserved 1114112K\n"
    )
    assert heap_used_mb(text) == 100.0
    assert heap_used_mb("12345:\nAttachNotSupportedException") is None


def test_heap_figures_take_the_old_generation_pools_peak():
    mib = 2**20
    pools = [
        ("CodeHeap 'non-nmethods'", False, 3 * mib),
        ("Metaspace", False, 90 * mib),
        ("G1 Eden Space", True, 200 * mib),
        ("G1 Old Gen", True, 301 * mib),
        ("G1 Survivor Space", True, 10 * mib),
    ]
    assert heap_figures(pools, 512 * mib) == {"heap_max_mb": 512.0, "old_gen_peak_mb": 301.0}
    serial = [("Tenured Gen", True, mib // 2), ("Eden Space", True, mib)]
    assert heap_figures(serial, -1) == {"heap_max_mb": None, "old_gen_peak_mb": 0.5}
    assert heap_figures([("ZHeap", True, mib)], mib) == {
        "heap_max_mb": 1.0,
        "old_gen_peak_mb": None,
    }


def test_failure_cause_names_the_exit_code_and_the_first_out_of_memory_error():
    log = (
        "26/11/25 16:49:49 ERROR Executor: Exception in task 1.0 in stage 18.0 (TID 16)\n"
        "java.lang.OutOfMemoryError: Java heap space\n"
        "\tat java.base/java.util.Arrays.copyOf(Arrays.java:3537)\n"
        "Caused by: java.lang.OutOfMemoryError: GC overhead limit exceeded\n"
    )
    assert failure_cause(52, log) == "exit 52, java.lang.OutOfMemoryError: Java heap space"
    assert failure_cause(1, "Traceback ...\nValueError: no\n") == "exit 1"
    assert failure_cause(None, "") == "exit None"


def test_a_storm_run_that_fails_is_a_row_saying_why(tmp_path):
    from bench.run import Bench, parse_args

    args = parse_args(["--only", "storm", "--storm-max-offsets-per-trigger", "50"])
    args.storm_caps = [50, 100]
    bench = Bench(args, tmp_path, "127.0.0.1:1", None)
    oom = "print('java.lang.OutOfMemoryError: Java heap space'); raise SystemExit(52)"
    command = [sys.executable, "-c", oom]

    with pytest.raises(RuntimeError, match="exit 52"):
        bench.run_process("storm-fail", command, tmp_path / "none.json")
    entry = bench.run_process("storm-cap100", command, tmp_path / "none.json", may_fail=True)

    assert entry["failed"] == "exit 52, java.lang.OutOfMemoryError: Java heap space"
    assert bench.summary("storm-cap100") is None
    rows = [
        [c.strip() for c in line.strip("|").split("|")] for line in bench.storm_table().split("\n")
    ]
    [row] = [cells for cells in rows if cells[0] == "100"]
    assert row[:4] == ["100", "exit 52, java.lang.OutOfMemoryError: Java heap space", "-", "-"]


def test_fixed_cost_helpers_pick_batches_and_quiet_triggers():
    from bench.report import changed, epoch_ms, idle_triggers_ms, trigger_ms

    progress = [
        {"batchId": 3, "timestamp": "2026-01-01T00:00:00.000Z", "numInputRows": 500,
         "durationMs": {"triggerExecution": 900}},
        {"batchId": 4, "timestamp": "2026-01-01T00:00:01.000Z", "numInputRows": 0,
         "durationMs": {"triggerExecution": 7}},
        {"batchId": 4, "timestamp": "2026-01-01T00:00:05.000Z", "numInputRows": 0,
         "durationMs": {"triggerExecution": 3}},
    ]  # fmt: skip
    assert trigger_ms(progress) == [900]
    assert trigger_ms(progress, rows=500) == [900]
    assert trigger_ms(progress, rows=50) == []
    start = epoch_ms("2026-01-01T00:00:00.500Z")
    assert idle_triggers_ms(progress, start, start + 4500) == [7, 3]
    assert idle_triggers_ms(progress, start, start + 1000) == [7]
    assert changed({"a": 1, "b": 2}, {"a": 1, "b": 3, "c": 0}) == ["b", "c"]


def test_the_hand_written_mapinarrow_job_calls_the_handler_on_each_record():
    rows = pa.RecordBatch.from_pylist(
        [
            {"partition": 1, "offset": 7, "value": b"abc"},
            {"partition": 0, "offset": 8, "value": b""},
        ]
    )

    out = list(per_record("trivial")(iter([rows])))

    assert [batch.to_pylist() for batch in out] == [
        [{"partition": 1, "offset": 7, "size": 3}, {"partition": 0, "offset": 8, "size": 0}]
    ]
    assert out[0].schema.field("size").type == pa.int32()


def test_outside_pace_is_the_big_runs_extra_records_over_its_extra_seconds():
    walls = {
        "outside-bare-100-r0": 10.0,
        "outside-bare-1100-r0": 20.0,
        "outside-retrylib-100-r0": 12.0,
        "outside-retrylib-100-r1": 11.0,
        "outside-retrylib-100-r2": 30.0,  # a noisy round: the median leaves it out
        "outside-retrylib-1100-r0": 16.0,
        "outside-storm-1100-r0": 25.0,
    }
    figures = outside.paces(walls, [100, 1100])
    assert figures["bare"] == {"small_s": 10.0, "big_s": 20.0, "pace": 100.0}
    assert figures["retrylib"]["small_s"] == 12.0 and figures["retrylib"]["pace"] == 250.0
    assert figures["storm"]["pace"] is None  # no small run to subtract
    assert figures["builtin"] == dict.fromkeys(("small_s", "big_s", "pace"))
    text = outside.outside_table(walls, [100, 1100], 3, 50)
    assert "pace 2.50x bare (>= 1.2x: met)" in text
    assert "start 1.20x bare (<= 1.1x: NOT met)" in text
    assert "storm pace -x the all-succeed pace (>= 0.8x: not measured)" in text
