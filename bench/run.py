"""Throughput, memory and retry lateness of retrylib against a hand-written baseline and a
do-nothing consumer, measured side by side in one run. Run by hand (not a test):

    .venv/bin/python -m bench.run                   # 1,000,000 records, 200 B, 6 partitions
    .venv/bin/python -m bench.run --records 50000   # a quick look

One embedded broker (noida-db) and one input topic serve every contender; each contender
runs in a process of its own while this process samples its memory (PSS of the process
tree) and CPU time. See bench/README.md for what each number means.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.data import produce_input
from bench.handlers import LATENESS_DDL, OUTPUT_DDL
from bench.procmem import TreeSampler, machine_busy_seconds, tree_cpu_seconds
from bench.report import fmt, percentile, rate, ratio, sum_counters, table

REPO = Path(__file__).resolve().parents[1]
PARTS = ("ceiling", "baseline", "retrylib", "arrow", "memory", "lateness")
MAIN_TOPIC = "bench-main"
LATE_TOPIC = "bench-late"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench.run", description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=1_000_000, help="input records (1000000)")
    p.add_argument("--partitions", type=int, default=6, help="input topic partitions (6)")
    p.add_argument("--record-bytes", type=int, default=200, help="bytes per record value (200)")
    p.add_argument(
        "--failure-rate", type=float, default=0.05, help="share failing once in the failure runs"
    )
    p.add_argument(
        "--baseline-flush", type=int, default=50_000, help="baseline Delta append every N (50000)"
    )
    p.add_argument(
        "--max-offsets-per-trigger",
        type=int,
        default=250_000,
        help="retrylib's batch size cap in the throughput runs (250000)",
    )
    p.add_argument(
        "--memory-caps",
        default="50000,250000",
        help="maxOffsetsPerTrigger values for the driver-memory check (a value equal to "
        "--max-offsets-per-trigger reuses the trivial throughput run)",
    )
    p.add_argument("--master", default="local[2]", help="Spark master (local[2])")
    p.add_argument("--tier-delay", default="10s", help="retry tier delay in throughput runs")
    p.add_argument("--lateness-records", type=int, default=200)
    p.add_argument("--lateness-delay", default="2s", help="tier delay of the lateness run")
    p.add_argument("--lateness-trigger", default="1s", help="trigger of the lateness run")
    p.add_argument(
        "--lateness-spread",
        type=float,
        default=10.0,
        help="seconds over which the lateness records are produced",
    )
    p.add_argument(
        "--only",
        default=",".join(PARTS),
        help=f"comma-separated subset of {','.join(PARTS)} (default: all)",
    )
    p.add_argument("--no-timers", action="store_true", help="run retrylib without bench timers")
    p.add_argument("--bootstrap", help="use this Kafka cluster instead of an embedded broker")
    p.add_argument("--workdir", help="where tables, logs and broker data go (a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the workdir")
    p.add_argument("--json", help="also write every raw measurement to this file")
    p.add_argument("--timeout", type=float, default=1800.0, help="per contender, seconds")
    args = p.parse_args(argv)
    args.only = [part.strip() for part in args.only.split(",") if part.strip()]
    unknown = set(args.only) - set(PARTS)
    if unknown:
        p.error(f"--only: unknown part(s) {sorted(unknown)}; choose from {PARTS}")
    args.memory_caps = [int(c) for c in args.memory_caps.split(",") if c.strip()]
    return args


def say(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class Bench:
    def __init__(self, args: argparse.Namespace, workdir: Path, bootstrap: str, broker_pid):
        self.args = args
        self.workdir = workdir
        self.bootstrap = bootstrap
        self.broker_pid = broker_pid
        self.env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
            ),
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
        }
        (workdir / "logs").mkdir(parents=True, exist_ok=True)
        self.results: dict[str, dict] = {}
        self.input: dict = {}

    # -- running one contender ----------------------------------------------------------

    def run_process(self, label: str, command: list[str], result_path: Path) -> dict:
        log_path = self.workdir / "logs" / f"{label}.log"
        say(f"{label}: running ({log_path})")
        broker_cpu = tree_cpu_seconds(self.broker_pid) if self.broker_pid else None
        machine_cpu = machine_busy_seconds()
        launched = time.time()
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                command, cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT
            )
            sampler = TreeSampler(process.pid).start()
            try:
                code = process.wait(self.args.timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                code = process.wait()
            stats = sampler.stop()
        exited = time.time()
        machine_cpu = machine_busy_seconds() - machine_cpu
        if broker_cpu is not None:
            after = tree_cpu_seconds(self.broker_pid)
            broker_cpu = None if after is None else round(after - broker_cpu, 2)
        # CPU used meanwhile by anything else on the machine (other jobs): a noisy neighbour
        # shows here, and the run's numbers should be read with it in mind.
        others = machine_cpu - sum(stats.cpu_seconds.values()) - (broker_cpu or 0)
        result = json.loads(result_path.read_text()) if result_path.exists() else None
        if code != 0 or result is None or result.get("error"):
            tail = log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{label} failed (exit {code}); log tail:\n{tail}")
        entry = {
            "label": label,
            "launched": launched,
            "exited": exited,
            "memory": stats.as_dict(),
            "broker_cpu_s": broker_cpu,
            "others_cpu_s": round(max(others, 0.0), 1),
            "load_avg": os.getloadavg()[0],
            "result": result,
        }
        self.results[label] = entry
        say(f"{label}: done in {exited - launched:.1f}s")
        return entry

    def contender(self, kind: str, label: str, **extra) -> dict:
        result_path = self.workdir / f"{label}.json"
        args = {"bootstrap": self.bootstrap, "topic": MAIN_TOPIC, "records": self.args.records}
        args.update(extra)
        command = [
            sys.executable,
            "-m",
            "bench.contenders",
            kind,
            json.dumps(args),
            str(result_path),
        ]
        return self.run_process(label, command, result_path)

    def retrylib(
        self,
        label: str,
        handler: str,
        *,
        cap: int | None,
        topic: str = MAIN_TOPIC,
        ddl: str = OUTPUT_DDL,
        delay: str | None = None,
        trigger: str = "1s",
        continuous: bool = False,
        expect_succeeded: int = 0,
        events: Path | None = None,
        kind: str = "record",
    ) -> dict:
        config = self.write_config(
            label, handler, cap, topic, ddl, delay or self.args.tier_delay, trigger, kind
        )
        result_path = self.workdir / f"{label}.json"
        command = [
            sys.executable,
            "-m",
            "bench.retrylib_driver",
            str(config),
            str(result_path),
            "--master",
            self.args.master,
            "--timeout",
            str(self.args.timeout),
        ]
        if self.args.no_timers:
            command.append("--no-timers")
        if continuous:
            command += ["--continuous", "--expect-succeeded", str(expect_succeeded)]
            command += ["--events", str(events)]
        return self.run_process(label, command, result_path)

    def write_config(self, label, handler, cap, topic, ddl, delay, trigger, kind="record"):
        root = self.workdir / label
        cap_line = f"max_offsets_per_trigger = {cap}" if cap else ""
        text = f"""
[job]
name = "{label}"
checkpoint = "{root}/checkpoint"
trigger = "{trigger}"

[kafka]
bootstrap_servers = "{self.bootstrap}"
topics = ["{topic}"]
starting_offsets = "earliest"
{cap_line}

[handler]
function = "bench.handlers:{handler}"
kind = "{kind}"
output_schema = "{ddl}"
paths = ["{REPO}"]

[output]
table = "{root}/out"

[retry]
delays = ["{delay}"]
max_attempts = 2
jitter = "0%"
topic_template = "{{topic}}.{label}.retry.{{delay}}"

[dead_letter]
topic = "{topic}.{label}.dlt"
table = "{root}/dead_letter"
"""
        path = self.workdir / f"{label}.toml"
        path.write_text(text)
        return path

    # -- the parts ----------------------------------------------------------------------

    def produce(self) -> None:
        from retrylib.kafka_client import ensure_topics, make_admin

        a = self.args
        ensure_topics(make_admin(self.bootstrap, {}), {MAIN_TOPIC: a.partitions}, create=True)
        say(f"producing {a.records:,} records of {a.record_bytes} bytes to {MAIN_TOPIC}")
        self.input = produce_input(
            self.bootstrap, MAIN_TOPIC, a.records, a.partitions, a.record_bytes, a.failure_rate
        )
        say(f"produced in {self.input['seconds']:.1f}s; {self.input['marked']:,} marked to fail")

    def run_throughput(self) -> None:
        a = self.args
        if "ceiling" in a.only:
            self.contender("ceiling", "ceiling")
        if "baseline" in a.only:
            from retrylib.kafka_client import ensure_topics, make_admin

            admin = make_admin(self.bootstrap, {})
            for label, handler in (("baseline-trivial", "trivial"), ("baseline-fail", "flaky")):
                retry_topic = f"{MAIN_TOPIC}.{label}.retry"
                ensure_topics(admin, {retry_topic: a.partitions}, create=True)
                self.contender(
                    "baseline",
                    label,
                    handler=handler,
                    table=str(self.workdir / label / "out"),
                    retry_topic=retry_topic,
                    flush_every=a.baseline_flush,
                    delay_ms=10_000,
                )
        if "retrylib" in a.only:
            cap = a.max_offsets_per_trigger
            self.retrylib("retrylib-trivial", "trivial", cap=cap)
            self.retrylib("retrylib-fail", "flaky", cap=cap)
        if "arrow" in a.only:
            self.retrylib(
                "retrylib-arrow", "trivial_arrow", cap=a.max_offsets_per_trigger, kind="arrow"
            )
        if "memory" in a.only:
            for cap in a.memory_caps:
                if cap == a.max_offsets_per_trigger and "retrylib-trivial" in self.results:
                    continue
                self.retrylib(f"retrylib-cap{cap}", "trivial", cap=cap)

    def run_lateness(self) -> None:
        from retrylib.kafka_client import ensure_topics, make_admin

        a = self.args
        ensure_topics(make_admin(self.bootstrap, {}), {LATE_TOPIC: a.partitions}, create=True)
        warm = 4 * a.partitions
        produce_input(self.bootstrap, LATE_TOPIC, warm, a.partitions, a.record_bytes, 0.0)
        events = self.workdir / "lateness-events.jsonl"
        events.touch()
        label = "lateness"
        # Start the job in the background; produce the timed records once it is warm.
        import threading

        holder: dict = {}

        def run() -> None:
            try:
                holder["entry"] = self.retrylib(
                    label,
                    "late_stamp",
                    cap=None,
                    topic=LATE_TOPIC,
                    ddl=LATENESS_DDL,
                    delay=a.lateness_delay,
                    trigger=a.lateness_trigger,
                    continuous=True,
                    expect_succeeded=warm + a.lateness_records,
                    events=events,
                )
            except Exception as e:  # reported below
                holder["error"] = e

        thread = threading.Thread(target=run)
        thread.start()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and thread.is_alive():
            done = sum(
                json.loads(line)["counters"].get("succeeded", 0)
                for line in events.read_text().splitlines()
            )
            if done >= warm:
                break
            time.sleep(0.2)
        time.sleep(2.0)  # idle: a few empty triggers
        say(
            f"lateness: job warm; producing {a.lateness_records} records over "
            f"{a.lateness_spread:.0f}s"
        )
        chunks = 20
        per_chunk = max(1, a.lateness_records // chunks)
        produced = 0
        for i in range(chunks):
            n = per_chunk if i < chunks - 1 else a.lateness_records - produced
            if n > 0:
                produce_input(
                    self.bootstrap,
                    LATE_TOPIC,
                    n,
                    a.partitions,
                    a.record_bytes,
                    1.0,
                    start_index=warm + produced,
                )
                produced += n
            time.sleep(a.lateness_spread / chunks)
        thread.join()
        if "error" in holder:
            raise holder["error"]
        from bench.lateness import handled_by_origin, not_before_by_origin
        from bench.report import lateness_ms, split_lateness

        retry_topic = f"{LATE_TOPIC}.{label}.retry.{a.lateness_delay}"
        due = not_before_by_origin(self.bootstrap, retry_topic)
        handled = handled_by_origin(str(self.workdir / label / "out"))
        values, missing = lateness_ms(handled, due)
        starts = [
            _epoch_ms(p["timestamp"])
            for p in holder["entry"]["result"]["progress"]
            if p.get("timestamp")
        ]
        waits, inside = split_lateness(handled, due, starts)
        holder["entry"]["lateness"] = {
            "produced": produced,
            "retried": len(due),
            "missing": missing,
            "values_ms": values,
            "wait_for_trigger_ms": waits,
            "in_batch_ms": inside,
        }

    # -- the tables ---------------------------------------------------------------------

    def report(self) -> str:
        out = [self.header()]
        out.append(self.throughput_table())
        out.append(self.shares_table())
        out.append(self.memory_table())
        out.append(self.lateness_table())
        return "\n\n".join(part for part in out if part)

    def header(self) -> str:
        a = self.args
        load = os.getloadavg()
        return (
            f"retrylib bench: {a.records:,} records x {a.record_bytes} B, {a.partitions} "
            f"partitions, failure rate {a.failure_rate:.0%} (failure runs), master {a.master}, "
            f"{os.cpu_count()} CPUs, load avg {load[0]:.2f}/{load[1]:.2f}/{load[2]:.2f}\n"
            f"input produced in {self.input.get('seconds', 0):.1f}s; "
            f"{self.input.get('marked', 0):,} records marked to fail once"
        )

    def summary(self, label: str) -> dict | None:
        """rec/s, times and memory of one run, the same fields for every kind."""
        entry = self.results.get(label)
        if entry is None:
            return None
        r, m = entry["result"], entry["memory"]
        wall = entry["exited"] - entry["launched"]
        row = {
            "wall": wall,
            "peak": m["peak_total_pss_mb"],
            "pss": m["peak_pss_mb"],
            "cpu": sum(m["cpu_seconds"].values()),
            "broker_cpu": entry["broker_cpu_s"],
            "others_cpu": entry.get("others_cpu_s"),
            "steady": None,
            "first_batch": None,
        }
        row["query_cpu"] = r.get("query_cpu_s")
        if "batches" in r:  # retrylib
            batches = r["batches"]
            counters = sum_counters(batches)
            last = max(b["end"] for b in batches)
            row["run"] = last - r["query_started"]
            row["startup"] = r["query_started"] - entry["launched"]
            row["records"] = counters.get("records_main", 0) + counters.get("records_retry", 0)
            row["out"] = counters.get("output_rows", 0)
            row["retried"] = sum(v for k, v in counters.items() if k.startswith("retried_tier"))
            row["batches"] = len(batches)
            row["first_batch"] = batches[0]["end"] - r["query_started"]
            if len(batches) > 1:
                rest = sum(
                    b["counters"].get("records_main", 0) + b["counters"].get("records_retry", 0)
                    for b in batches[1:]
                )
                row["steady"] = rate(rest, last - batches[0]["end"])
        else:
            row["run"] = r["done"] - r["first"]
            row["startup"] = r["first"] - entry["launched"]
            row["records"] = r["records"]
            row["out"] = r.get("succeeded")
            row["retried"] = r.get("retried")
            row["batches"] = r.get("flushes")
        row["rate"] = rate(row["records"], row["run"])
        # CPU per record, robust to other users of the machine: for retrylib the CPU of its
        # processes while the query ran (JVM start-up left out), else the whole process.
        cpu = sum(row["query_cpu"].values()) if row["query_cpu"] else row["cpu"]
        row["cpu_us"] = 1e6 * cpu / row["records"] if row["records"] else None
        row["wall_rate"] = rate(row["records"], wall)
        return row

    def throughput_table(self) -> str:
        labels = [
            ("ceiling", "ceiling: plain consumer", "-"),
            ("baseline-trivial", "baseline: 1 process", "trivial"),
            ("baseline-fail", "baseline: 1 process", f"{self.args.failure_rate:.0%} fail"),
            ("retrylib-trivial", "retrylib --available-now", "trivial"),
            ("retrylib-fail", "retrylib --available-now", f"{self.args.failure_rate:.0%} fail"),
            ("retrylib-arrow", "retrylib --available-now", "trivial, kind=arrow"),
        ]
        rows = []
        for label, name, handler in labels:
            s = self.summary(label)
            if s is None:
                continue
            pss = s["pss"]
            rows.append(
                [
                    name,
                    handler,
                    round(s["rate"]) if s["rate"] else None,
                    round(s["steady"]) if s["steady"] else None,
                    round(s["wall_rate"]) if s["wall_rate"] else None,
                    s["run"],
                    s["startup"],
                    s["wall"],
                    round(s["peak"]),
                    " / ".join(
                        fmt(round(pss[g])) if g in pss else "-"
                        for g in ("driver", "jvm", "workers")
                    ),
                    s["cpu"],
                    round(s["cpu_us"], 1) if s["cpu_us"] else None,
                    s["broker_cpu"],
                    s["others_cpu"],
                    s["out"],
                    s["retried"],
                    s["batches"],
                ]
            )
        if not rows:
            return ""
        text = table(
            [
                "contender",
                "handler",
                "rec/s",
                "steady rec/s",
                "rec/s wall",
                "run s",
                "startup s",
                "wall s",
                "peak MiB",
                "py / JVM / workers MiB",
                "CPU s",
                "CPU us/rec",
                "broker CPU s",
                "others CPU s",
                "out rows",
                "retried",
                "batches",
            ],
            rows,
            "Throughput (rec/s = records / run s; run = first record asked for .. every effect "
            "durable; steady = retrylib after its first batch; peak = PSS of the process tree; "
            "CPU us/rec = CPU of the contender's processes per record, for retrylib while "
            "the query ran)",
        )
        return text + "\n" + self.ratio_lines()

    def ratio_lines(self) -> str:
        lines = []
        ceiling = self.summary("ceiling")
        for variant in ("trivial", "fail"):
            ours = self.summary(f"retrylib-{variant}")
            base = self.summary(f"baseline-{variant}")
            if ours is None:
                continue
            parts = []
            for key, what in (("rate", "run"), ("steady", "steady"), ("wall_rate", "wall")):
                mine = ours.get(key)
                vs_base = ratio(mine, base and base["rate" if key == "steady" else key])
                vs_ceiling = ratio(mine, ceiling and ceiling["rate" if key == "steady" else key])
                parts.append(f"{what}: {fmt(vs_base, 2)}x baseline, {fmt(vs_ceiling, 2)}x ceiling")
            lines.append(f"retrylib {variant:7}  " + " | ".join(parts))
        arrow, base = self.summary("retrylib-arrow"), self.summary("baseline-trivial")
        if arrow:
            lines.append(
                f"retrylib vectorised (kind=arrow, same work as trivial): run "
                f"{fmt(ratio(arrow['rate'], base and base['rate']), 2)}x baseline trivial, "
                f"{fmt(ratio(arrow['rate'], ceiling and ceiling['rate']), 2)}x ceiling | steady "
                f"{fmt(ratio(arrow['steady'], base and base['rate']), 2)}x baseline, "
                f"{fmt(ratio(arrow['steady'], ceiling and ceiling['rate']), 2)}x ceiling"
            )
        if lines:
            lines.append(
                "goal (issue): >= 1.50x baseline and >= 0.40x ceiling with the trivial handler"
            )
        return "\n".join(lines)

    def shares_table(self) -> str:
        rows, details = [], []
        for label in [k for k in self.results if k.startswith("retrylib")]:
            r = self.results[label]["result"]
            batches = r["batches"]
            if not batches:
                continue
            c = sum_counters(batches)
            d = sum_counters(batches, "driver_ms")
            last = max(b["end"] for b in batches)
            query_ms = (last - r["query_started"]) * 1000
            task = c.get("bench_task_ms", 0)
            if not task:
                continue
            wait = c.get("bench_source_wait_ms", 0) + c.get("kafka_read_ms", 0)
            handler = c.get("handler_ms", 0)
            parquet = c.get("bench_parquet_ms", 0)
            routing = max(task - wait - handler - parquet, 0)
            job = d.get("route_job", 0)
            sinks = d.get("produce", 0) + d.get("delta_commits", 0) + d.get("manifest", 0)
            sinks += d.get("clean_up", 0)
            apportioned = {
                "source": job * wait / task,
                "handler": job * handler / task,
                "routing": job * routing / task,
                "sinks": job * parquet / task + sinks,
            }
            other = query_ms - sum(apportioned.values())
            pct = {k: 100 * v / query_ms for k, v in apportioned.items()}
            rows.append(
                [
                    label,
                    query_ms / 1000,
                    len(batches),
                    f"{pct['source']:.0f}%",
                    f"{pct['handler']:.0f}%",
                    f"{pct['routing']:.0f}%",
                    f"{pct['sinks']:.0f}%",
                    f"{100 * other / query_ms:.0f}%",
                ]
            )
            engine = sum(
                p["durationMs"].get("triggerExecution", 0) - p["durationMs"].get("addBatch", 0)
                for p in r["progress"]
            )
            cpu = r.get("query_cpu_s") or {}
            records = c.get("records_main", 0) + c.get("records_retry", 0)
            cpu_text = ", ".join(
                f"{group} {seconds:.1f}s ({1e6 * seconds / records:.0f} us/rec)"
                for group, seconds in sorted(cpu.items())
                if records
            )
            details.append(
                f"{label}: CPU while the query ran: {cpu_text}\n"
                f"    query {query_ms / 1000:.1f}s = Spark jobs routing records "
                f"{job / 1000:.1f}s + retry produce {d.get('produce', 0) / 1000:.2f}s + Delta "
                f"commits {d.get('delta_commits', 0) / 1000:.2f}s + manifest/clean-up "
                f"{(d.get('manifest', 0) + d.get('clean_up', 0)) / 1000:.2f}s + engine outside "
                f"foreachBatch {engine / 1000:.2f}s + rest "
                f"{(query_ms - job - sinks - engine) / 1000:.2f}s\n"
                f"        task time {task / 1000:.1f}s over {c.get('bench_tasks', 0)} tasks "
                f"(2 slots): reading Kafka {100 * wait / task:.0f}% | handler "
                f"{100 * handler / task:.0f}% | retrylib per-record routing "
                f"{100 * routing / task:.0f}% | Parquet writes {100 * parquet / task:.0f}%"
            )
        if not rows:
            return ""
        return (
            table(
                ["run", "query s", "batches", "source", "handler", "routing", "sinks", "other"],
                rows,
                "retrylib: where the query's wall time goes (routing-job wall time split by "
                "executor task time; sinks = Parquet writes + retry produce + Delta commits + "
                "manifest; other = engine triggers, planning, first-batch worker start)",
            )
            + "\n"
            + "\n".join(details)
        )

    def memory_table(self) -> str:
        rows = []
        labels = [f"retrylib-cap{cap}" for cap in self.args.memory_caps]
        labels = [
            "retrylib-trivial"
            if cap == self.args.max_offsets_per_trigger and "retrylib-trivial" in self.results
            else label
            for cap, label in zip(self.args.memory_caps, labels, strict=True)
        ]
        for cap, label in zip(self.args.memory_caps, labels, strict=True):
            s = self.summary(label)
            if s is None:
                continue
            m = self.results[label]["memory"]
            rows.append(
                [
                    f"{cap:,}",
                    s["batches"],
                    round(s["rate"]) if s["rate"] else None,
                    m["peak_pss_mb"].get("driver"),
                    m["peak_pss_mb"].get("jvm"),
                    m["peak_pss_mb"].get("workers"),
                    m["peak_total_pss_mb"],
                    m["peak_rss_mb"].get("driver"),
                    m["peak_rss_mb"].get("jvm"),
                    m["max_processes"],
                ]
            )
        if not rows:
            return ""
        return table(
            [
                "maxOffsetsPerTrigger",
                "batches",
                "rec/s",
                "driver py PSS",
                "JVM PSS",
                "workers PSS",
                "total PSS",
                "driver py RSS",
                "JVM RSS",
                "processes",
            ],
            rows,
            "Driver memory against batch size (retrylib, trivial handler; peaks in MiB)",
        )

    def lateness_table(self) -> str:
        entry = self.results.get("lateness")
        if not entry or "lateness" not in entry:
            return ""
        late = entry["lateness"]
        values = late["values_ms"]
        q = {p: percentile(values, p) for p in (50, 90, 99)}
        early = sum(1 for v in values if v < 0)
        waits, inside = late.get("wait_for_trigger_ms", []), late.get("in_batch_ms", [])
        main = table(
            [
                "records",
                "retried",
                "handled",
                "not handled",
                "tier delay",
                "trigger",
                "p50 ms",
                "p90 ms",
                "p99 ms",
                "min ms",
                "max ms",
                "early",
            ],
            [
                [
                    late["produced"],
                    late["retried"],
                    len(values),
                    late["missing"],
                    self.args.lateness_delay,
                    self.args.lateness_trigger,
                    q[50],
                    q[90],
                    q[99],
                    min(values) if values else None,
                    max(values) if values else None,
                    early,
                ]
            ],
            "Retry lateness on an idle job (handled_at in the output row - retrylib.not_before "
            "header on the retry record; records produced over "
            f"{self.args.lateness_spread:.0f}s, each failing once; "
            f"others CPU s during the run: {entry.get('others_cpu_s')})",
        )
        if not waits:
            return main
        parts = table(
            ["part of lateness", "p50 ms", "p90 ms", "p99 ms", "max ms"],
            [
                [
                    name,
                    percentile(v, 50),
                    percentile(v, 90),
                    percentile(v, 99),
                    max(v) if v else None,
                ]
                for name, v in (
                    ("not-before -> start of the trigger that handled it", waits),
                    ("trigger start -> handler call (plan + run the batch)", inside),
                )
            ],
        )
        return main + "\n" + parts


def _epoch_ms(iso: str) -> int:
    """Epoch ms of a StreamingQueryProgress timestamp like 2026-11-23T06:37:19.123Z."""
    from datetime import datetime

    return round(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    own_workdir = args.workdir is None
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="retrylib-bench-")).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    broker = None
    try:
        if args.bootstrap:
            bootstrap, broker_pid = args.bootstrap, None
        else:
            from retrylib.broker import EmbeddedBroker

            broker = EmbeddedBroker(data_dir=workdir / "broker").start()
            bootstrap = broker.bootstrap_servers
            broker_pid = broker._process.pid if broker._process else None
        say(f"workdir {workdir}; broker {bootstrap}")
        bench = Bench(args, workdir, bootstrap, broker_pid)
        if set(args.only) & {"ceiling", "baseline", "retrylib", "arrow", "memory"}:
            bench.produce()
            bench.run_throughput()
        if "lateness" in args.only:
            bench.run_lateness()
        text = bench.report()
        print(text)
        if args.json:
            Path(args.json).write_text(
                json.dumps({"args": vars(args), "input": bench.input, "runs": bench.results})
            )
        return 0
    finally:
        if broker is not None:
            broker.stop()
        if own_workdir and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
