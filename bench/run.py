"""Throughput, memory and retry lateness of retrylib against a bare Spark pipeline, a
seed-style one-process loop and a do-nothing consumer, measured side by side in one run.
Run by hand (not a test):

    .venv/bin/python -m bench.run                    # 1,000,000 records, 200 B, 6 partitions
    .venv/bin/python -m bench.run --records 200000 --max-offsets-per-trigger 50000

One embedded Apache Kafka broker (`retrylib.dev.broker.EmbeddedBroker`, a JVM process) and one
input topic serve every contender; each contender runs in a process of its own while this
process samples its memory (PSS of the process tree) and CPU time. See bench/README.md for
what each number means.
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

from bench import outside
from bench.data import produce_input
from bench.handlers import LATENESS_DDL, OUTPUT_DDL
from bench.outside import GOAL_STORM_VS_SUCCEED
from bench.procmem import TreeSampler, machine_busy_seconds, tree_cpu_seconds
from bench.report import (
    batch_ends,
    changed,
    epoch_ms,
    failure_cause,
    fmt,
    full_batch_rate,
    idle_triggers_ms,
    percentile,
    rate,
    ratio,
    steady_rate,
    sum_counters,
    table,
    trigger_ms,
    verdict,
)
from tests.helpers import write_job_toml

REPO = Path(__file__).resolve().parents[1]
PARTS = (
    "ceiling",
    "baseline",
    "bare",
    "mapinarrow",
    "retrylib",
    "arrow",
    "python",
    "memory",
    "lateness",
    "lanes",
    "key_order",
    "storm",
    "fixed_cost",
    "outside",
)
THROUGHPUT_PARTS = set(PARTS) - {"lateness", "lanes", "storm", "fixed_cost", "outside"}
STORM_RUNS = (("storm-succeed", "trivial"), ("storm-fail", "flaky"))
"""The storm part's side-by-side runs on the same records: all succeed, all fail once."""
# Goals of the issue, for retrylib with the per-record handler, in steady state.
GOAL_VS_BARE = 0.8
GOAL_VS_BASELINE = 1.5
# Goals of issue 26 for the default reader (kafka.source = "auto": retrylib's own source).
GOAL_DEFAULT_VS_BARE = 1.2
GOAL_DEFAULT_VS_MAPINARROW = 1.5
MAIN_TOPIC = "bench-main"
LATE_TOPIC = "bench-late"
LANES_TOPIC = "bench-lanes"
STORM_TOPIC = "bench-storm"
LANES_FACTORS = (1, 4)  # calls at once per run, times the partitions
FIXED_RUNS = ("lateness", "paced", "submit", "router")
LATENESS_RUNS = (("lateness", "warm"), ("lateness-start", "from a start"))
"""(label, what it measures) of the lateness part's runs."""
FIXED_TOPIC = "bench-fixed"  # one per contender: bench-fixed-retrylib, bench-fixed-bare
SUBMIT_TOPIC = "bench-submit"
ROUTER_TOPIC = "bench-delay"
ROUTER_FINAL_TOPIC = "bench-forwarded"
FIXED_FAILURE_RATE = 0.1
RECORD_KEYS = ("records_main", "records_retry")  # a retrylib batch's records, by counter
# Goals of issue 26 (the fixed_cost part): each an upper bound.
GOAL_LATENESS_P99_S = 1.2
GOAL_BATCH_VS_BARE = 2.0
GOAL_QUIET_TRIGGER_S = 0.3
GOAL_START_VS_BARE = 1.2
GOAL_ROUTER_P99_S = 1.5


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
        help="maxOffsetsPerTrigger of retrylib and the bare pipeline (250000)",
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
        "--lateness-source", default="auto", help="kafka.source of the lateness run (auto)"
    )
    p.add_argument(
        "--read-ahead", help="retry.read_ahead of retrylib's runs (the config's default)"
    )
    p.add_argument(
        "--lateness-spread",
        type=float,
        default=10.0,
        help="seconds over which the lateness records are produced",
    )
    p.add_argument(
        "--lanes-records",
        type=int,
        default=40_000,
        help="records of the lanes runs, each handled with a 5 ms wait (40000)",
    )
    p.add_argument(
        "--storm-records",
        type=int,
        default=1_000_000,
        help="records of the storm runs, all failing once in the storm (1000000)",
    )
    p.add_argument(
        "--storm-record-bytes", type=int, default=1000, help="bytes per storm record value (1000)"
    )
    p.add_argument(
        "--storm-max-offsets-per-trigger",
        type=int,
        default=100_000,
        help="maxOffsetsPerTrigger of the storm and all-succeed runs (100000)",
    )
    p.add_argument(
        "--storm-caps",
        default="100000,1000000",
        help="maxOffsetsPerTrigger values for the storm's driver-memory check (0: no cap; a "
        "value equal to --storm-max-offsets-per-trigger reuses the storm run)",
    )
    p.add_argument("--storm-delay", default="1s", help="retry tier delay of the storm runs (1s)")
    p.add_argument(
        "--storm-source",
        default="auto",
        help="kafka.source of the storm runs (auto: what a new job reads with)",
    )
    p.add_argument(
        "--fixed-records", type=int, default=500, help="records per batch in fixed_cost (500)"
    )
    p.add_argument(
        "--fixed-batches", type=int, default=8, help="timed batches in fixed_cost, each (8)"
    )
    p.add_argument(
        "--fixed-quiet", type=float, default=15.0, help="seconds of the quiet job watched (15)"
    )
    p.add_argument(
        "--submit-records", type=int, default=200, help="input of the spark-submit run (200)"
    )
    p.add_argument(
        "--router-records", type=int, default=60, help="records the delay router forwards (60)"
    )
    p.add_argument("--router-delay", default="5s", help="the delay router's delay topic (5s)")
    p.add_argument(
        "--router-read-ahead", help="delay_router.read_ahead of the router run (the default)"
    )
    p.add_argument(
        "--fixed-runs",
        default=",".join(FIXED_RUNS),
        help=f"the fixed_cost part's runs, a subset of {','.join(FIXED_RUNS)} (default: all)",
    )
    p.add_argument(
        "--outside-records",
        default="20000,600000",
        help="the outside part's small and big input, records (20000,600000)",
    )
    p.add_argument(
        "--outside-rounds", type=int, default=3, help="rounds of the outside part's runs (3)"
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
    args.storm_caps = [int(c) for c in args.storm_caps.split(",") if c.strip()]
    args.outside_records = [int(c) for c in args.outside_records.split(",") if c.strip()]
    if len(args.outside_records) != 2 or args.outside_records[0] >= args.outside_records[1]:
        p.error("--outside-records: two sizes, the small one first (20000,600000)")
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
        self.storm_input: dict = {}
        self.fixed: dict[str, dict] = {}  # the fixed_cost part's figures, by run

    # -- running one contender ----------------------------------------------------------

    def run_process(
        self, label: str, command: list[str], result_path: Path, *, may_fail: bool = False
    ) -> dict:
        """Run one contender and sample it; its entry in `results`. A contender that fails
        raises, unless `may_fail`: then its entry says why (`failed`: exit code and any
        OutOfMemoryError of its log) beside what was measured until it ended."""
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
        failed = None
        if code != 0 or result is None or result.get("error"):
            text = log_path.read_text(errors="replace")
            if not may_fail:
                raise RuntimeError(f"{label} failed (exit {code}); log tail:\n{text[-3000:]}")
            failed = failure_cause(code, text)
            say(f"{label}: FAILED ({failed}); log {log_path}")
        entry = {
            "label": label,
            "launched": launched,
            "exited": exited,
            "memory": stats.as_dict(),
            "broker_cpu_s": broker_cpu,
            "others_cpu_s": round(max(others, 0.0), 1),
            "load_avg": os.getloadavg()[0],
            "result": result,
            "failed": failed,
        }
        self.results[label] = entry
        if failed is None:
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
        source: str = "builtin",
        parallelism: int = 1,
        key_ordered: bool = False,
        may_fail: bool = False,
        stop_file: Path | None = None,
        idle_progress_ms: int | None = None,
        timers: bool = True,
    ) -> dict:
        config = self.write_config(
            label,
            handler,
            cap,
            topic,
            ddl,
            delay or self.args.tier_delay,
            trigger,
            kind,
            source,
            parallelism,
            key_ordered,
        )
        return self.drive(
            label,
            config,
            continuous=continuous,
            expect_succeeded=expect_succeeded,
            events=events,
            may_fail=may_fail,
            stop_file=stop_file,
            idle_progress_ms=idle_progress_ms,
            timers=timers,
        )

    def drive(
        self,
        label: str,
        config: Path,
        *,
        continuous: bool = False,
        expect_succeeded: int = 0,
        events: Path | None = None,
        may_fail: bool = False,
        stop_file: Path | None = None,
        idle_progress_ms: int | None = None,
        timers: bool = True,
    ) -> dict:
        """Run the job of `config` with bench/retrylib_driver.py; see `retrylib`."""
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
        if self.args.no_timers or not timers:
            command.append("--no-timers")
        if continuous:
            command += ["--continuous", "--expect-succeeded", str(expect_succeeded)]
            command += ["--events", str(events)]
        if stop_file is not None:
            command += ["--stop-file", str(stop_file)]
        if idle_progress_ms is not None:
            command += ["--idle-progress-ms", str(idle_progress_ms)]
        return self.run_process(label, command, result_path, may_fail=may_fail)

    def bare(
        self,
        label: str,
        cap: int | None,
        topic: str = MAIN_TOPIC,
        handler: str | None = None,
        **continuous,
    ) -> dict:
        """The bare Spark pipeline (bench/bare_driver.py) on `topic`, or with `handler` the
        hand-written `mapInArrow` job calling it; `continuous` (trigger, stop_file, events)
        runs it on a processing-time trigger until stop_file exists."""
        root = self.workdir / label
        args = {
            "bootstrap": self.bootstrap,
            "topic": topic,
            "table": str(root / "out"),
            "checkpoint": str(root / "checkpoint"),
            "max_offsets_per_trigger": cap,
            "handler": handler,
            **{k: str(v) for k, v in continuous.items()},
        }
        result_path = self.workdir / f"{label}.json"
        command = [
            sys.executable,
            "-m",
            "bench.bare_driver",
            json.dumps(args),
            str(result_path),
            "--master",
            self.args.master,
            "--timeout",
            str(self.args.timeout),
        ]
        return self.run_process(label, command, result_path)

    def write_config(
        self, label, handler, cap, topic, ddl, delay, trigger, kind, source, parallelism, ordered
    ):
        root = self.workdir / label
        return write_job_toml(
            self.workdir / f"{label}.toml",
            workdir=root,
            topics=[topic],
            name=label,
            bootstrap_servers=self.bootstrap,
            handler={
                "function": f"bench.handlers:{handler}",
                "output_schema": ddl,
                "paths": [REPO],
                "kind": kind,
                "parallelism": parallelism,
            },
            job={"trigger": trigger},
            kafka={
                "starting_offsets": "earliest",
                "source": source,
                "max_offsets_per_trigger": cap or None,
            },
            retry={
                "delays": [delay],
                "max_attempts": 2,
                "jitter": "0%",
                "topic_template": f"{{topic}}.{label}.retry.{{delay}}",
                "key_ordered": ordered,
                "read_ahead": self.args.read_ahead,
            },
            dead_letter={"topic": f"{topic}.{label}.dlt", "table": f"{root}/dead_letter"},
        )

    # -- the parts ----------------------------------------------------------------------

    def produce(self) -> None:
        from retrylib.kafka.clients import ensure_topics, make_admin

        a = self.args
        ensure_topics(make_admin(self.bootstrap, {}), {MAIN_TOPIC: a.partitions}, create=True)
        say(f"producing {a.records:,} records of {a.record_bytes} bytes to {MAIN_TOPIC}")
        self.input = produce_input(
            self.bootstrap, MAIN_TOPIC, a.records, a.partitions, a.record_bytes, a.failure_rate
        )
        say(f"produced in {self.input['seconds']:.1f}s; {self.input['marked']:,} marked to fail")

    def run_throughput(self) -> None:
        a = self.args
        cap = a.max_offsets_per_trigger
        if "ceiling" in a.only:
            self.contender("ceiling", "ceiling")
        if "bare" in a.only:
            self.bare("bare", cap)
        if "mapinarrow" in a.only:
            self.bare("mapinarrow", cap, handler="trivial")
        if "baseline" in a.only:
            from retrylib.kafka.clients import ensure_topics, make_admin

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
            self.retrylib("retrylib-trivial", "trivial", cap=cap)
            self.retrylib("retrylib-fail", "flaky", cap=cap)
        if "arrow" in a.only:
            self.retrylib("retrylib-arrow", "trivial_arrow", cap=cap, kind="arrow")
        if "python" in a.only:
            self.retrylib("retrylib-python", "trivial", cap=cap, source="python")
        if "key_order" in a.only:
            # The same failing input with and without key order, twice in turn: what the
            # key groups, the queues and their updates cost when no key repeats.
            for run in (1, 2):
                self.retrylib(f"keys-unordered-{run}", "flaky", cap=cap, source="python")
                self.retrylib(
                    f"keys-ordered-{run}", "flaky", cap=cap, source="python", key_ordered=True
                )
        if "memory" in a.only:
            for memory_cap in a.memory_caps:
                if memory_cap == cap and "retrylib-trivial" in self.results:
                    continue
                self.retrylib(f"retrylib-cap{memory_cap}", "trivial", cap=memory_cap)

    def run_outside(self) -> None:
        """Each contender of `bench.outside.CONTENDERS` on a small and a big input, as whole
        processes, in turn within each size and round; retrylib without bench timers."""
        from retrylib.kafka.clients import ensure_topics, make_admin

        a = self.args
        inputs = [(n, storm) for n in a.outside_records for storm in (False, True)]
        topics = {outside.topic(n, storm): a.partitions for n, storm in inputs}
        ensure_topics(make_admin(self.bootstrap, {}), topics, create=True)
        for n, storm in inputs:
            say(f"outside: producing {n:,} records to {outside.topic(n, storm)}")
            produce_input(
                self.bootstrap, outside.topic(n, storm), n, a.partitions, a.record_bytes,
                1.0 if storm else 0.0,
            )  # fmt: skip
        cap = a.max_offsets_per_trigger
        for round_ in range(a.outside_rounds):
            for n in a.outside_records:
                for key, _ in outside.CONTENDERS:
                    label, topic = outside.label(key, n, round_), outside.topic(n, key == "storm")
                    if key in ("bare", "mapinarrow"):
                        handler = "trivial" if key == "mapinarrow" else None
                        self.bare(label, cap, topic=topic, handler=handler)
                        continue
                    self.retrylib(
                        label,
                        "flaky" if key == "storm" else "trivial",
                        cap=cap,
                        topic=topic,
                        delay=a.storm_delay,
                        source="builtin" if key == "builtin" else "auto",
                        timers=False,
                    )

    def outside_table(self) -> str:
        walls = {
            label: entry["exited"] - entry["launched"]
            for label, entry in self.results.items()
            if label.startswith("outside-") and not entry.get("failed")
        }
        a = self.args
        return outside.outside_table(
            walls, a.outside_records, a.outside_rounds, a.max_offsets_per_trigger
        )

    def run_lanes(self) -> None:
        """A handler that waits 5 ms per record, with as many calls at once as the topic has
        partitions (what a consumer per partition gets), then with 4 times as many (lanes)."""
        from retrylib.kafka.clients import ensure_topics, make_admin

        a = self.args
        ensure_topics(make_admin(self.bootstrap, {}), {LANES_TOPIC: a.partitions}, create=True)
        produce_input(self.bootstrap, LANES_TOPIC, a.lanes_records, a.partitions, 200, 0.0)
        for factor in LANES_FACTORS:
            self.retrylib(
                f"lanes-x{factor}",
                "waiting_io",
                cap=a.lanes_records // 2,  # two batches: "steady" is the second one
                topic=LANES_TOPIC,
                parallelism=self.lanes_per_task(factor),
            )

    def lanes_per_task(self, factor: int) -> int:
        """Lanes per task for `factor` x partitions calls at once: a batch runs one task per
        core."""
        return max(1, factor * self.args.partitions // self.cores())

    def run_storm(self) -> None:
        """A failure storm: every record of its own topic fails once (`flaky` on input all
        marked to fail: a retry record to produce per record), against the same records all
        succeeding (`trivial`); then the storm again at each `--storm-caps` batch size, for
        the driver's memory. A run that fails (an OutOfMemoryError) is reported, not fatal."""
        from retrylib.kafka.clients import ensure_topics, make_admin

        a = self.args
        ensure_topics(make_admin(self.bootstrap, {}), {STORM_TOPIC: a.partitions}, create=True)
        say(
            f"storm: producing {a.storm_records:,} records of {a.storm_record_bytes} bytes to "
            f"{STORM_TOPIC}, all marked to fail once"
        )
        self.storm_input = produce_input(
            self.bootstrap, STORM_TOPIC, a.storm_records, a.partitions, a.storm_record_bytes, 1.0
        )
        say(f"storm: produced in {self.storm_input['seconds']:.1f}s")
        cap = a.storm_max_offsets_per_trigger
        for label, handler in STORM_RUNS:
            self.retrylib(
                label,
                handler,
                cap=cap,
                topic=STORM_TOPIC,
                delay=a.storm_delay,
                source=a.storm_source,
                may_fail=True,
            )
        for memory_cap in a.storm_caps:
            if memory_cap != cap:
                self.retrylib(
                    f"storm-cap{memory_cap}",
                    "flaky",
                    cap=memory_cap,
                    topic=STORM_TOPIC,
                    delay=a.storm_delay,
                    source=a.storm_source,
                    may_fail=True,
                )

    def storm_label(self, cap: int) -> str:
        """The run of the storm at batch size `cap` (the storm run itself at its own cap)."""
        return "storm-fail" if cap == self.args.storm_max_offsets_per_trigger else f"storm-cap{cap}"

    def run_lateness(self) -> None:
        """Retry lateness on a warm, idle job: records produced over `--lateness-spread`
        seconds once the job has run its first batches, each failing once; then from a start
        (`run_lateness_from_start`)."""
        from retrylib.kafka.clients import ensure_topics, make_admin

        a = self.args
        ensure_topics(make_admin(self.bootstrap, {}), {LATE_TOPIC: a.partitions}, create=True)
        warm = 4 * a.partitions
        produce_input(self.bootstrap, LATE_TOPIC, warm, a.partitions, a.record_bytes, 0.0)
        events = self.workdir / "lateness-events.jsonl"
        events.touch()
        label = "lateness"
        # Start the job in the background; produce the timed records once it is warm.
        job = self.lateness_job(label, LATE_TOPIC, warm + a.lateness_records, events)
        wait_events(events, warm, job, timeout=300)
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
        self.measure_lateness(label, LATE_TOPIC, produced, job.join())
        self.run_lateness_from_start()

    def run_lateness_from_start(self) -> None:
        """Retry lateness with the first batch's retries counted: `--lateness-records`
        records, each failing once, in the topic before the job starts."""
        from retrylib.kafka.clients import ensure_topics, make_admin

        a = self.args
        topic = f"{LATE_TOPIC}-start"
        ensure_topics(make_admin(self.bootstrap, {}), {topic: a.partitions}, create=True)
        produce_input(
            self.bootstrap, topic, a.lateness_records, a.partitions, a.record_bytes, 1.0
        )  # fmt: skip
        events = self.workdir / "lateness-start-events.jsonl"
        events.touch()
        label = "lateness-start"
        job = self.lateness_job(label, topic, a.lateness_records, events)
        self.measure_lateness(label, topic, a.lateness_records, job.join())

    def lateness_job(self, label: str, topic: str, succeeded: int, events: Path) -> Background:
        """The lateness runs' job (`late_stamp`, the lateness tier and trigger), in the
        background until `succeeded` records have succeeded."""
        a = self.args
        return Background(
            lambda: self.retrylib(
                label,
                "late_stamp",
                cap=None,
                topic=topic,
                ddl=LATENESS_DDL,
                delay=a.lateness_delay,
                trigger=a.lateness_trigger,
                source=a.lateness_source,
                continuous=True,
                expect_succeeded=succeeded,
                events=events,
            )
        )

    def measure_lateness(self, label: str, topic: str, produced: int, entry: dict) -> None:
        """Each retried record's lateness in the run `entry` of `label` on `topic`: handled_at
        of its output row - the retrylib.not_before header of its retry record."""
        from bench.lateness import handled_by_origin, not_before_by_origin
        from bench.report import lateness_ms, split_lateness

        retry_topic = f"{topic}.{label}.retry.{self.args.lateness_delay}"
        due = not_before_by_origin(self.bootstrap, retry_topic)
        handled = handled_by_origin(str(self.workdir / label / "out"))
        values, missing = lateness_ms(handled, due)
        starts = [
            epoch_ms(p["timestamp"]) for p in entry["result"]["progress"] if p.get("timestamp")
        ]
        waits, inside = split_lateness(handled, due, starts)
        entry["lateness"] = {
            "produced": produced,
            "retried": len(due),
            "missing": missing,
            "values_ms": values,
            "wait_for_trigger_ms": waits,
            "in_batch_ms": inside,
        }

    def run_fixed_cost(self) -> None:
        """The goals of issue 26, each measured on its own (see bench/README.md): retry
        lateness (the lateness part), a 500-record batch against the bare pipeline's, what a
        quiet job does, spark-submit to the first batch, the delay router's lateness."""
        from retrylib.kafka.clients import ensure_topics, make_admin

        a = self.args
        runs = set(a.fixed_runs.split(","))
        if "lateness" in runs and "lateness" not in self.results:
            self.run_lateness()
        if "paced" in runs:
            topics = {f"{FIXED_TOPIC}-{name}": a.partitions for name in ("retrylib", "bare")}
            ensure_topics(make_admin(self.bootstrap, {}), topics, create=True)
            self.fixed["retrylib"] = self.run_paced("retrylib")
            self.fixed["bare"] = self.run_paced("bare")
        if "submit" in runs:
            self.fixed["submit"] = self.run_submit()
        if "router" in runs:
            self.fixed["router"] = self.run_router()

    def run_paced(self, name: str) -> dict:
        """retrylib (flaky handler, trigger 1 s, output and dead-letter tables) or the bare
        pipeline on a topic of its own, fed `--fixed-records` records at a time: one batch to
        warm up, then `--fixed-batches`, each once the job has handled the one before
        (retries included). retrylib is then watched while nothing comes in."""
        a = self.args
        label, topic = f"fixed-{name}", f"{FIXED_TOPIC}-{name}"
        events, stop = self.workdir / f"{label}-events.jsonl", self.workdir / f"{label}.stop"
        events.touch()
        if name == "retrylib":
            job = Background(
                lambda: self.retrylib(
                    label,
                    "flaky",
                    cap=None,
                    topic=topic,
                    delay="1s",
                    trigger="1s",
                    source="auto",
                    continuous=True,
                    events=events,
                    stop_file=stop,
                    idle_progress_ms=1000,
                )
            )
        else:
            job = Background(
                lambda: self.bare(
                    label, None, topic, trigger="1 second", stop_file=stop, events=events
                )
            )
        n = a.fixed_records
        say(f"{label}: {a.fixed_batches} batches of {n} records ({FIXED_FAILURE_RATE:.0%} fail)")
        for k in range(a.fixed_batches + 1):  # the first one warms the job up
            produce_input(
                self.bootstrap, topic, n, a.partitions, a.record_bytes, FIXED_FAILURE_RATE,
                start_index=k * n,
            )  # fmt: skip
            if not wait_events(events, (k + 1) * n, job, timeout=240 if k == 0 else 60):
                break
            if k < a.fixed_batches:
                time.sleep(1.0)
        quiet = self.watch_quiet(label, events) if name == "retrylib" else {}
        stop.touch()
        result = job.join()["result"]
        progress = result["progress"]
        if "batches" in result:  # retrylib's own source's input rows are offset ranges
            records = {
                b["batch_id"]: b["counters"].get("records_main", 0)
                + b["counters"].get("records_retry", 0)
                for b in result["batches"]
            }
            progress = [{**p, "numInputRows": records.get(p.get("batchId"), 0)} for p in progress]
        # The warm-up is the first batch that read anything (if its records came in two
        # batches, the second reads fewer than n and is not timed either).
        warm = min((p["batchId"] for p in progress if p.get("numInputRows")), default=None)
        timed = trigger_ms([p for p in progress if p.get("batchId") != warm], rows=n)
        return {"timed_ms": timed, **quiet}

    def watch_quiet(self, label: str, events: Path) -> dict:
        """What the job does while no record comes in, from the end of its last batch that
        read records (its retries are handled) for `--fixed-quiet` seconds: the end offsets
        of every topic and the versions of its Delta tables before and after, and its
        checkpoint's files."""
        from bench.fixed_cost import delta_versions, topic_ends

        root = self.workdir / label
        tables = {"output": root / "out", "dead-letter": root / "dead_letter"}

        def snapshot() -> dict:
            files = sum(1 for f in (root / "checkpoint").rglob("*") if f.is_file())
            versions = {f"{k} table version": v for k, v in delta_versions(tables).items()}
            ends = {f"topic {k} end": v for k, v in topic_ends(self.bootstrap).items()}
            return {**versions, **ends, "checkpoint files": files}

        before, now = snapshot(), time.time()
        lines = [json.loads(line) for line in events.read_text().splitlines()]
        started = max((b["end"] for b in lines if b["counters"].get("succeeded")), default=now)
        say(f"{label}: watching the quiet job for {self.args.fixed_quiet:.0f}s")
        time.sleep(self.args.fixed_quiet)
        ended, after = time.time(), snapshot()
        files = "checkpoint files"
        return {
            "quiet_start": min(started, now),
            "quiet_end": ended,
            "written": [
                f"{k} {before.get(k)} -> {after.get(k)}"
                for k in changed(before, after)
                if k != files
            ],
            "checkpoint_files": [before[files], after[files]],
        }

    def run_submit(self) -> dict:
        """`./spark-submit.sh CONFIG`, the user's entry point, with `--submit-records`
        records (10% failing once) already in its topic: launch -> first metrics line."""
        from bench.fixed_cost import time_to_first_batch
        from retrylib.kafka.clients import ensure_topics, make_admin

        a = self.args
        ensure_topics(make_admin(self.bootstrap, {}), {SUBMIT_TOPIC: a.partitions}, create=True)
        produce_input(
            self.bootstrap, SUBMIT_TOPIC, a.submit_records, a.partitions, a.record_bytes,
            FIXED_FAILURE_RATE,
        )  # fmt: skip
        config = self.write_config(
            "submit", "flaky", None, SUBMIT_TOPIC, OUTPUT_DDL, "5s", "1s", "record", "auto",
            1, False,
        )  # fmt: skip
        env = {**self.env, "RETRYLIB_SPARK_EXTRA": f"--master {a.master}"}
        log_path = self.workdir / "logs" / "submit.log"
        say(f"submit: ./spark-submit.sh {config.name} ({log_path})")
        result = time_to_first_batch(
            [str(REPO / "spark-submit.sh"), str(config)], REPO, env, log_path, timeout=180
        )
        say(f"submit: first batch after {fmt(result['seconds'])}s; exit {result['exit']}")
        # Bare Spark's start beside it: the same records, Kafka -> Delta, launch to its first
        # batch done (the end of its first trigger).
        bare = self.bare("submit-bare", None, topic=SUBMIT_TOPIC)
        first = bare["result"]["progress"][0]
        done = epoch_ms(first["timestamp"]) / 1000 + first["durationMs"]["triggerExecution"] / 1000
        result["bare_seconds"] = done - bare["launched"]
        say(f"submit: bare Spark's first batch after {fmt(result['bare_seconds'])}s")
        return result

    def run_router(self) -> dict:
        """The delay router on a `--router-delay` delay topic, trigger 1 s: records sent over
        10 s once it is warm; lateness = the forwarded record's LogAppendTime on its final
        topic - (msg_ts + delay)."""
        from bench.fixed_cost import forwarded_lateness_ms, produce_delayed
        from retrylib.kafka.clients import ensure_topics, make_admin

        a = self.args
        delay_topic = f"{ROUTER_TOPIC}-{a.router_delay}"
        ensure_topics(make_admin(self.bootstrap, {}), {delay_topic: 2}, create=True)
        ensure_topics(
            make_admin(self.bootstrap, {}),
            {ROUTER_FINAL_TOPIC: 2},
            create=True,
            configs={ROUTER_FINAL_TOPIC: {"message.timestamp.type": "LogAppendTime"}},
        )
        label = "router"
        config = self.workdir / "router.toml"
        config.write_text(
            f'[job]\nname = "bench-router"\ncheckpoint = "{self.workdir / label}/checkpoint"\n'
            f'trigger = "1s"\n\n[kafka]\nbootstrap_servers = "{self.bootstrap}"\n\n'
            f'[delay_router]\ntopics = {{ "{delay_topic}" = "{a.router_delay}" }}\n'
            + (f'read_ahead = "{a.router_read_ahead}"\n' if a.router_read_ahead else "")
        )
        events, stop = self.workdir / f"{label}-events.jsonl", self.workdir / f"{label}.stop"
        events.touch()
        warm = 4
        produce_delayed(self.bootstrap, delay_topic, ROUTER_FINAL_TOPIC, warm, 0, "warm")
        job = Background(
            lambda: self.drive(
                label, config, continuous=True, events=events, stop_file=stop, timers=True
            )
        )
        wait_events(events, warm, job, key="forwarded", timeout=240)
        say(f"router: warm; sending {a.router_records} records over 10s")
        produce_delayed(
            self.bootstrap, delay_topic, ROUTER_FINAL_TOPIC, a.router_records, 10.0, "timed"
        )
        wait_events(events, warm + a.router_records, job, key="forwarded", timeout=60)
        stop.touch()
        job.join()
        from retrylib.config.durations import parse_duration

        delay_ms = parse_duration(a.router_delay, "--router-delay")
        values = forwarded_lateness_ms(self.bootstrap, ROUTER_FINAL_TOPIC, delay_ms, "timed")
        return {"values_ms": values, "sent": a.router_records}

    # -- the tables ---------------------------------------------------------------------

    def report(self) -> str:
        out = [self.header()]
        out.append(self.outside_table())
        out.append(self.throughput_table())
        out.append(self.split_table())
        out.append(self.memory_table())
        out.append(self.lateness_table())
        out.append(self.lanes_table())
        out.append(self.key_order_table())
        out.append(self.storm_table())
        out.append(self.fixed_cost_table())
        return "\n\n".join(part for part in out if part)

    def header(self) -> str:
        a = self.args
        load = os.getloadavg()
        machine = (
            f"master {a.master}, {os.cpu_count()} CPUs, "
            f"load avg {load[0]:.2f}/{load[1]:.2f}/{load[2]:.2f}"
        )
        if not self.input:  # no throughput part ran: its input was not produced
            return f"retrylib bench: {machine}"
        return (
            f"retrylib bench: {a.records:,} records x {a.record_bytes} B, {a.partitions} "
            f"partitions, failure rate {a.failure_rate:.0%} (failure runs), "
            f"maxOffsetsPerTrigger {a.max_offsets_per_trigger:,}, {machine}\n"
            f"input produced in {self.input.get('seconds', 0):.1f}s; "
            f"{self.input.get('marked', 0):,} records marked to fail once"
        )

    def summary(self, label: str) -> dict | None:
        """rec/s, times and memory of one run, the same fields for every kind."""
        entry = self.results.get(label)
        if entry is None or entry.get("failed"):
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
            "first_batch": None,
            "query_cpu": r.get("query_cpu_s"),
        }
        if "progress" in r:  # a Spark query: retrylib or the bare pipeline
            per_batch = spark_batches(r)
            row["run"] = per_batch[-1][0] - r["query_started"] if per_batch else None
            row["startup"] = r["query_started"] - entry["launched"]
            row["first_batch"] = per_batch[0][0] - r["query_started"] if per_batch else None
            row["steady"] = steady_rate([(end, n) for end, n, _ in per_batch])
            row["full"] = full_batch_rate([(n, took) for _, n, took in per_batch[1:]])
            row["batches"] = len(per_batch)
            if "batches" in r:
                counters = sum_counters(r["batches"])
                row["records"] = counters.get("records_main", 0) + counters.get("records_retry", 0)
                row["out"] = counters.get("output_rows", 0)
                row["retried"] = sum(v for k, v in counters.items() if k.startswith("retried_tier"))
            else:
                row["records"] = r["records"]
                row["out"] = r.get("succeeded")
                row["retried"] = None
        else:  # a one-process loop: no start-up inside its run, so steady = its whole run
            row["run"] = r["done"] - r["first"]
            row["startup"] = r["first"] - entry["launched"]
            row["records"] = r["records"]
            row["out"] = r.get("succeeded")
            row["retried"] = r.get("retried")
            row["batches"] = r.get("flushes")
            row["steady"] = rate(row["records"], row["run"])
            row["full"] = row["steady"]
        row["rate"] = rate(row["records"], row["run"])
        # CPU per record, robust to other users of the machine: for a Spark query the CPU of
        # its processes while the query ran (JVM start-up left out), else the whole process.
        cpu = sum(row["query_cpu"].values()) if row["query_cpu"] else row["cpu"]
        row["cpu_us"] = 1e6 * cpu / row["records"] if row["records"] else None
        row["wall_rate"] = rate(row["records"], wall)
        return row

    def rows(self) -> list[tuple[str, str, str, str | None]]:
        """(label, contender, handler, baseline label to compare with) of every row."""
        fail = f"{self.args.failure_rate:.0%} fail"
        builtin, trivial = "retrylib, builtin source", "baseline-trivial"
        return [
            ("ceiling", "ceiling: plain consumer", "-", None),
            ("baseline-trivial", "baseline: seed-style loop", "trivial", None),
            ("baseline-fail", "baseline: seed-style loop", fail, None),
            ("bare", "bare Spark: kafka -> delta", "none (JVM select)", trivial),
            ("mapinarrow", "hand-written mapInArrow: kafka -> delta", "trivial", trivial),
            ("retrylib-trivial", builtin, "trivial", trivial),
            ("retrylib-fail", builtin, fail, "baseline-fail"),
            ("retrylib-arrow", builtin, "trivial, kind=arrow", trivial),
            ("retrylib-python", "retrylib, python source", "trivial", trivial),
        ]

    def ratios(
        self, label: str, baseline: str | None, key: str = "steady"
    ) -> tuple[float | None, float | None]:
        """(rec/s over the bare pipeline's, over the baseline's) of one row; `key` says
        which rate: "steady" or "full" (full batches)."""
        ours, bare = self.summary(label), self.summary("bare")
        base = self.summary(baseline) if baseline else None
        if ours is None:
            return None, None
        return (
            ratio(ours[key], bare and bare[key]),
            ratio(ours[key], base and base[key]),
        )

    def throughput_table(self) -> str:
        rows = []
        for label, name, handler, baseline in self.rows():
            s = self.summary(label)
            if s is None:
                continue
            vs_bare, vs_base = self.ratios(label, baseline)
            pss = s["pss"]
            rows.append(
                [
                    name,
                    handler,
                    round(s["rate"]) if s["rate"] else None,
                    round(s["steady"]) if s["steady"] else None,
                    round(s["full"]) if s["full"] else None,
                    f"{vs_bare:.2f}" if vs_bare else "-",
                    f"{vs_base:.2f}" if vs_base else "-",
                    round(s["wall_rate"]) if s["wall_rate"] else None,
                    s["run"],
                    s["first_batch"],
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
                "full-batch rec/s",
                "x bare",
                "x baseline",
                "rec/s wall",
                "run s",
                "1st batch s",
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
            "durable; steady = after the first batch for Spark queries, the whole run for the "
            "one-process loops; full-batch = records / trigger time of the batches after the "
            "first holding at least half the largest batch's records; x bare, x baseline = "
            "steady rec/s over the bare pipeline's and over the baseline's with the same "
            "handler; peak = PSS of the process tree; "
            "CPU us/rec = CPU of the contender's processes per record, for Spark while the "
            "query ran)",
        )
        return text + "\n" + self.goal_lines()

    def goal_lines(self) -> str:
        lines = [
            f"goals (issue; steady state, per-record handler): retrylib >= {GOAL_VS_BARE:.2f}x "
            f"bare and >= {GOAL_VS_BASELINE:.2f}x the seed-style baseline"
        ]
        for label, name, handler, baseline in self.rows():
            if not label.startswith("retrylib") or self.summary(label) is None:
                continue
            vs_bare, vs_base = self.ratios(label, baseline)
            full_bare, full_base = self.ratios(label, baseline, "full")
            lines.append(
                f"  {name}, {handler}: {fmt(vs_bare, 2)}x bare "
                f"({verdict(vs_bare, GOAL_VS_BARE)}), {fmt(vs_base, 2)}x {baseline} "
                f"({verdict(vs_base, GOAL_VS_BASELINE)}); full batches only: "
                f"{fmt(full_bare, 2)}x bare, {fmt(full_base, 2)}x {baseline}"
            )
        builtin, python = self.summary("retrylib-trivial"), self.summary("retrylib-python")
        bare, by_hand = self.summary("bare"), self.summary("mapinarrow")
        if python and (bare or by_hand):
            vs_bare = ratio(python["steady"], bare and bare["steady"])
            vs_hand = ratio(python["steady"], by_hand and by_hand["steady"])
            lines.append(
                "  issue 26, the default reader (kafka.source = auto: python), trivial, steady: "
                f"{fmt(vs_bare, 2)}x bare ({verdict(vs_bare, GOAL_DEFAULT_VS_BARE)}), "
                f"{fmt(vs_hand, 2)}x hand-written mapInArrow "
                f"({verdict(vs_hand, GOAL_DEFAULT_VS_MAPINARROW)})"
            )
        if builtin and python:
            lines.append(
                "  python source / builtin source (trivial): steady "
                f"{fmt(ratio(python['steady'], builtin['steady']), 2)}x, full batches "
                f"{fmt(ratio(python['full'], builtin['full']), 2)}x, run "
                f"{fmt(ratio(python['rate'], builtin['rate']), 2)}x, CPU per record "
                f"{fmt(python['cpu_us'])} vs {fmt(builtin['cpu_us'])} us"
            )
        return "\n".join(lines) if len(lines) > 1 else ""

    def split_table(self) -> str:
        """Where the steady-state time goes: driver steps, executor tasks, CPU per record."""
        rows, tasks, cpu_rows = [], [], []
        labels = [
            k
            for k in self.results
            if (k.startswith(("retrylib", "fixed-")) or k == "bare" or k in dict(STORM_RUNS))
            and self.summary(k)
        ]
        for label in labels:
            r = self.results[label]["result"]
            by_id = {p["batchId"]: p for p in r.get("progress", []) if p.get("batchId") is not None}
            batches = r.get("batches")
            # An idle trigger's progress (no input; a processing-time run) is no batch.
            ran = [i for i in sorted(by_id) if by_id[i].get("numInputRows")]
            ids = ran if batches is None else [b["batch_id"] for b in batches]
            if not ids:
                continue
            steady_ids = ids[1:] if len(ids) > 1 else ids
            durations = [by_id[i]["durationMs"] for i in steady_ids if i in by_id]
            wall = sum(d.get("triggerExecution", 0) for d in durations)
            add_batch = sum(d.get("addBatch", 0) for d in durations)
            records = sum(by_id[i].get("numInputRows") or 0 for i in steady_ids if i in by_id)
            if batches is not None:
                chosen = [b for b in batches if b["batch_id"] in steady_ids]
                c, d = sum_counters(chosen), sum_counters(chosen, "driver_ms")
                records = c.get("records_main", 0) + c.get("records_retry", 0)
            else:
                c, d = {}, {}
            if not wall or not records:
                continue
            staging = d.get("staging_write", 0)
            counting = d.get("route", 0) - staging
            produce, appends = d.get("produce", 0), d.get("delta_appends", 0)
            other = add_batch - staging - counting - produce - appends
            parts = [staging, counting, produce, appends, other, wall - add_batch]
            rows.append(
                [
                    label,
                    "2.." if len(ids) > 1 else "all",
                    len(steady_ids),
                    records,
                    wall / 1000,
                    *(_share(ms, wall) for ms in parts),
                    1e6 * wall / 1000 / records,
                ]
            )
            task = c.get("bench_task_ms", 0)
            if task:
                wait = c.get("bench_source_wait_ms", 0)
                read = c.get("kafka_read_ms", 0)
                handler = c.get("handler_ms", 0)
                handoff = c.get("bench_handoff_ms", 0)
                routing = task - wait - read - handler - handoff
                tasks.append(
                    [
                        label,
                        c.get("bench_tasks", 0),
                        task / 1000,
                        round(100 * task / max(staging * 2, 1)),
                        *(
                            f"{1000 * ms / records:.1f}"
                            for ms in (wait, read, handler, routing, handoff, task)
                        ),
                    ]
                )
            entry = self.results[label]
            s = self.summary(label)
            cpu = r.get("query_cpu_s") or {}
            if cpu and s and s["records"]:
                broker = entry.get("broker_cpu_s") or 0.0
                groups = [cpu.get(g, 0.0) for g in ("driver", "jvm", "workers")]
                total = sum(groups) + broker
                cpu_rows.append(
                    [
                        label,
                        *(f"{1e6 * v / s['records']:.1f}" for v in groups),
                        f"{1e6 * broker / s['records']:.1f}",
                        f"{1e6 * total / s['records']:.1f}",
                        round(self.cores() * s["records"] / total) if total else None,
                        round(s["steady"]) if s["steady"] else None,
                    ]
                )
        if not rows:
            return ""
        out = [
            table(
                [
                    "run",
                    "batches",
                    "n",
                    "records",
                    "wall s",
                    "staging write",
                    "rest of routing",
                    "Kafka produce",
                    "Delta appends",
                    "rest of batch",
                    "engine",
                    "us/rec",
                ],
                rows,
                "Where the steady-state wall time goes (batches after the first; wall = sum of "
                "triggerExecution; staging write = the Spark job running the handler tasks and "
                "writing their result rows as Parquet (routing_stage._run_tasks), counting them "
                "as it writes; rest of routing = the rest of RoutingStage._route (the control "
                "topic's end offset); Kafka produce = the executors producing the outgoing "
                "retry/dead-letter records; Delta appends = append_once of output and "
                "dead-letter rows (produce and appends run at once, so they overlap); rest of "
                "batch = "
                "the rest of foreachBatch (manifest, clean-up, metrics, reading the staging folder "
                "for the produce); engine = the trigger outside foreachBatch (offsets, "
                "planning, commit); for bare, the whole Spark write is in 'rest of batch')",
            )
        ]
        if tasks:
            out.append(
                table(
                    [
                        "run",
                        "tasks",
                        "task s",
                        "slots busy %",
                        "wait for input",
                        "Kafka read in task",
                        "handler",
                        "routing",
                        "hand-off",
                        "task total",
                    ],
                    tasks,
                    "Executor tasks of the staging write, us per record of task time (steady "
                    "batches; wait for input = Spark's Kafka source in the JVM producing Arrow "
                    "batches, as the Python worker sees it; Kafka read in task = the python "
                    "source's tasks reading their ranges; routing = the rest of retrylib's "
                    "task; hand-off = yielding result rows to the JVM, which writes the Parquet; "
                    "slots busy = task time / (2 slots x staging write wall))",
                )
            )
        if cpu_rows:
            out.append(
                table(
                    [
                        "run",
                        "driver py",
                        "JVM",
                        "workers",
                        "broker",
                        "total",
                        "CPU-bound rec/s",
                        "steady rec/s",
                    ],
                    cpu_rows,
                    "CPU per record, us (over the whole query, first batch and JIT warm-up "
                    "included; broker over the whole process run; CPU-bound rec/s = "
                    f"{self.cores()} cores / total: the pace if the CPU were the only limit, "
                    "which a steady rec/s may pass since the first batch costs most)",
                )
            )
        return "\n\n".join(out)

    def cores(self) -> int:
        return os.cpu_count() or 1

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

    def lanes_table(self) -> str:
        runs = [(f, self.summary(f"lanes-x{f}")) for f in LANES_FACTORS]
        runs = [(f, s) for f, s in runs if s is not None]
        if not runs:
            return ""
        first = runs[0][1]
        rows = []
        for factor, s in runs:
            lanes = self.lanes_per_task(factor)
            vs = ratio(s["steady"], first["steady"])
            rows.append(
                [lanes * self.cores(), lanes, fmt(s["steady"], 0), fmt(s["run"]), fmt(vs, 2)]
            )
        title = (
            f"handler.parallelism (virtual partitions): {self.args.lanes_records:,} records, "
            f"a 5 ms wait each, {self.args.partitions} partitions, {self.cores()} cores"
        )
        headers = ["calls at once", "lanes/task", "steady rec/s", "run s", "x first row"]
        return table(headers, rows, title)

    def key_order_table(self) -> str:
        rows = []
        for run in (1, 2):
            plain = self.summary(f"keys-unordered-{run}")
            ordered = self.summary(f"keys-ordered-{run}")
            if plain is None or ordered is None:
                continue
            for label, s in (("unordered", plain), ("key_ordered", ordered)):
                vs = ratio(s["steady"], plain["steady"])
                rows.append(
                    [run, label, fmt(s["steady"], 0), fmt(s["run"]), fmt(s["cpu_us"]), fmt(vs, 2)]
                )
        if not rows:
            return ""
        title = (
            f"retry.key_ordered: the failure run on kafka.source = python, {self.cores()} cores "
            "(every key distinct, so nothing is held: the cost of the machinery)"
        )
        headers = ["run", "job", "steady rec/s", "run s", "cpu us/rec", "x unordered"]
        return table(headers, rows, title)

    def storm_memory(self, label: str) -> list[object]:
        """Peak memory columns of a storm table's row, also for a run that failed (its peaks
        until it ended): driver Python PSS, JVM PSS, JVM old generation peak, JVM heap max,
        Python workers PSS, total PSS, in MiB."""
        entry = self.results[label]
        m = entry["memory"]
        heap = (entry["result"] or {}).get("jvm_heap") or {}
        return [
            m["peak_pss_mb"].get("driver"),
            m["peak_pss_mb"].get("jvm"),
            heap.get("old_gen_peak_mb"),
            heap.get("heap_max_mb"),
            m["peak_pss_mb"].get("workers"),
            m["peak_total_pss_mb"],
        ]

    def storm_outcome(self, label: str) -> tuple[str, int | None, int | None]:
        """("ok" or why it failed, batches run, records of the largest batch) of a storm
        run; a run that failed counts the batches it finished."""
        entry = self.results[label]
        batches = (entry["result"] or {}).get("batches") or []
        sizes = [
            b["counters"].get("records_main", 0) + b["counters"].get("records_retry", 0)
            for b in batches
        ]
        return entry.get("failed") or "ok", len(batches) or None, max(sizes, default=None)

    def storm_table(self) -> str:
        a = self.args
        memory_headers = [
            "driver py PSS",
            "JVM PSS",
            "JVM old gen peak",
            "JVM heap max",
            "workers PSS",
            "total PSS",
        ]
        runs = [(label, handler) for label, handler in STORM_RUNS if label in self.results]
        out = []
        if runs:
            rows = []
            for label, handler in runs:
                outcome, batches, _ = self.storm_outcome(label)
                s = self.summary(label)
                rows.append(
                    [
                        "all succeed" if handler == "trivial" else "storm: all fail once",
                        handler,
                        outcome,
                        batches,
                        fmt(s and s["steady"], 0),
                        fmt(s and s["rate"], 0),
                        fmt(s and s["run"]),
                        fmt(s and s["retried"]),
                        fmt(s and s["out"]),
                        *self.storm_memory(label),
                    ]
                )
            title = (
                f"Failure storm: {a.storm_records:,} records x {a.storm_record_bytes} B, "
                f"{a.partitions} partitions, maxOffsetsPerTrigger "
                f"{a.storm_max_offsets_per_trigger:,}, tier delay {a.storm_delay}, "
                f"kafka.source {a.storm_source}, input "
                f"produced in {self.storm_input.get('seconds', 0):.1f}s (steady = after the "
                "first batch; storm = every record fails once, so each is a retry record to "
                "produce; peaks in MiB: PSS of the driver's Python process, of the JVM (the "
                "driver and, in local mode, the executors), of Spark's Python workers (the "
                "executors' Python side); JVM old gen peak and heap max from the JVM's memory "
                "pools)"
            )
            headers = ["run", "handler", "outcome", "batches", "steady rec/s", "rec/s", "run s"]
            out.append(table([*headers, "retried", "out rows", *memory_headers], rows, title))
            succeed, storm = self.summary("storm-succeed"), self.summary("storm-fail")
            if succeed and storm:
                steady = ratio(storm["steady"], succeed["steady"])
                out[-1] += (
                    f"\nstorm / all succeed: steady {fmt(steady, 2)}x (goal >= "
                    f"{GOAL_STORM_VS_SUCCEED}x: {verdict(steady, GOAL_STORM_VS_SUCCEED)}), run "
                    f"{fmt(ratio(storm['rate'], succeed['rate']), 2)}x, CPU per record "
                    f"{fmt(storm['cpu_us'])} vs {fmt(succeed['cpu_us'])} us"
                )
        rows = []
        for cap in a.storm_caps:
            label = self.storm_label(cap)
            if label not in self.results:
                continue
            outcome, batches, largest = self.storm_outcome(label)
            rows.append(
                [
                    f"{cap:,}" if cap else "none",
                    outcome,
                    batches,
                    largest,
                    *self.storm_memory(label),
                    self.results[label]["memory"]["peak_rss_mb"].get("jvm"),
                ]
            )
        if rows:
            out.append(
                table(
                    ["maxOffsetsPerTrigger", "outcome", "batches", "largest batch"]
                    + memory_headers
                    + ["JVM RSS"],
                    rows,
                    f"Failure storm: driver memory against batch size ({a.storm_records:,} "
                    f"records x {a.storm_record_bytes} B, every one failing once; largest batch "
                    "= records of the biggest batch that finished; peaks in MiB)",
                )
            )
        return "\n\n".join(out)

    def fixed_cost_table(self) -> str:
        if not self.fixed:
            return ""
        a = self.args

        def seconds(ms: float | None) -> float | None:
            return None if ms is None else ms / 1000

        rows = []
        for label, name in LATENESS_RUNS:  # issue 68: every retry counts, a start's too
            late = (self.results.get(label) or {}).get("lateness")
            if not late:
                continue
            values = late["values_ms"]
            rows.append(
                [
                    f"retry lateness p99, {name} (output + dead-letter tables)",
                    f"<= {GOAL_LATENESS_P99_S} s",
                    fmt(seconds(percentile(values, 99)), 2),
                    verdict(seconds(percentile(values, 99)), GOAL_LATENESS_P99_S, at_most=True),
                    f"{len(values)} retried records, p50 {fmt(seconds(percentile(values, 50)), 2)}"
                    f" s; tier {a.lateness_delay}, trigger {a.lateness_trigger}",
                ]
            )
        ours, bare = self.fixed.get("retrylib"), self.fixed.get("bare")
        if ours and bare:
            mine, theirs = percentile(ours["timed_ms"], 50), percentile(bare["timed_ms"], 50)
            vs = ratio(mine, theirs)
            rows.append(
                [
                    f"{a.fixed_records}-record batch, {FIXED_FAILURE_RATE:.0%} failing, / bare",
                    f"<= {GOAL_BATCH_VS_BARE:.1f}x",
                    fmt(vs, 2),
                    verdict(vs, GOAL_BATCH_VS_BARE, at_most=True),
                    f"median triggerExecution: retrylib {fmt(seconds(mine), 2)} s "
                    f"({len(ours['timed_ms'])} batches), bare Kafka -> Delta "
                    f"{fmt(seconds(theirs), 2)} s ({len(bare['timed_ms'])} batches)",
                ]
            )
        if ours and "quiet_start" in ours:
            result = self.results["fixed-retrylib"]["result"]
            start, end = ours["quiet_start"], ours["quiet_end"]
            idle = idle_triggers_ms(result["progress"], int(start * 1000), int(end * 1000))
            ran = [b for b in result["batches"] if start < b["end"] <= end]
            # A batch that ran with no records is an empty batch too: the worst of the two.
            took = [b["duration_ms"] for b in ran]
            cost = seconds(max(percentile(idle, 50) or 0, percentile(took, 50) or 0) or None)
            quiet = verdict(cost, GOAL_QUIET_TRIGGER_S, at_most=True)
            if ours["written"] and quiet == "met":
                quiet = "NOT met (writes)"
            rows.append(
                [
                    "quiet job: a trigger with no input",
                    f"<= {GOAL_QUIET_TRIGGER_S} s, writes nothing",
                    fmt(cost, 2),
                    quiet,
                    f"{end - start:.0f} s quiet: {len(idle)} triggers with no input reported "
                    f"(median {fmt(seconds(percentile(idle, 50)), 2)} s), {len(ran)} batches "
                    f"ran ({', '.join(f'{t / 1000:.2f}' for t in took) or '-'} s, records "
                    f"{sum(b['counters'].get(k, 0) for b in ran for k in RECORD_KEYS)}); "
                    f"written: {'; '.join(ours['written']) or 'nothing'}; checkpoint files "
                    f"{' -> '.join(map(str, ours['checkpoint_files']))}",
                ]
            )
        submit = self.fixed.get("submit")
        if submit:
            vs = ratio(submit["seconds"], submit.get("bare_seconds"))
            rows.append(
                [
                    f"./spark-submit.sh -> first batch done ({a.submit_records} records) / bare",
                    f"<= {GOAL_START_VS_BARE:.1f}x",
                    fmt(vs, 2),
                    verdict(vs, GOAL_START_VS_BARE, at_most=True),
                    f"launch to the first retrylib.metrics line {fmt(submit['seconds'], 1)} s "
                    f"(exit {submit['exit']} after SIGTERM); bare Kafka -> Delta, launch to "
                    f"its first batch done {fmt(submit.get('bare_seconds'), 1)} s",
                ]
            )
        router = self.fixed.get("router")
        if router:
            values = router["values_ms"]
            p99 = seconds(percentile(values, 99))
            rows.append(
                [
                    f"delay router lateness p99 ({a.router_delay} delay topic)",
                    f"<= {GOAL_ROUTER_P99_S} s",
                    fmt(p99, 2),
                    verdict(p99, GOAL_ROUTER_P99_S, at_most=True),
                    f"{len(values)} of {router['sent']} forwarded, p50 "
                    f"{fmt(seconds(percentile(values, 50)), 2)} s, min "
                    f"{fmt(seconds(min(values, default=None)), 2)} s; trigger 1s, read-ahead "
                    f"{a.router_read_ahead or 'default'}",
                ]
            )
        return table(
            ["goal (issues 26, 44)", "target", "measured", "verdict", "how"],
            rows,
            "Fixed costs (trigger 1 s; others CPU s meanwhile: "
            + ", ".join(
                f"{label} {self.results[label].get('others_cpu_s')}"
                for label in ("lateness", "fixed-retrylib", "fixed-bare", "router")
                if label in self.results
            )
            + ")",
        )

    def lateness_table(self) -> str:
        runs = [
            (name, self.results[label])
            for label, name in LATENESS_RUNS
            if "lateness" in self.results.get(label, {})
        ]
        if not runs:
            return ""
        rows, parts = [], []
        for name, entry in runs:
            late = entry["lateness"]
            values = late["values_ms"]
            rows.append(
                [
                    name,
                    late["produced"],
                    late["retried"],
                    len(values),
                    late["missing"],
                    percentile(values, 50),
                    percentile(values, 90),
                    percentile(values, 99),
                    min(values) if values else None,
                    max(values) if values else None,
                    sum(1 for v in values if v < 0),
                    entry.get("others_cpu_s"),
                ]
            )
            for part, v in (
                ("not-before -> start of the trigger that handled it", late["wait_for_trigger_ms"]),
                ("trigger start -> handler call (plan + run the batch)", late["in_batch_ms"]),
            ):
                parts.append(
                    [name, part, percentile(v, 50), percentile(v, 90), percentile(v, 99)]
                    + [max(v) if v else None]
                )
        headers = ["run", "records", "retried", "handled", "not handled", "p50 ms", "p90 ms"]
        headers += ["p99 ms", "min ms", "max ms", "early", "others CPU s"]
        main = table(
            headers,
            rows,
            f"Retry lateness (tier {self.args.lateness_delay}, trigger "
            f"{self.args.lateness_trigger}; handled_at in the output row - retrylib.not_before "
            "header on the retry record; each record failing once; warm: produced over "
            f"{self.args.lateness_spread:.0f}s once the job ran its first batches; from a "
            "start: in the topic before the job started, the first batch's retries counted)",
        )
        return (
            main
            + "\n"
            + table(["run", "part of lateness", "p50 ms", "p90 ms", "p99 ms", "max ms"], parts)
        )


class Background:
    """`run()` in a thread of its own (a contender that runs while the bench feeds it);
    `join` returns its result or raises its exception."""

    def __init__(self, run) -> None:
        import threading

        self._outcome: dict = {}
        self._thread = threading.Thread(target=self._run, args=(run,), daemon=True)
        self._thread.start()

    def _run(self, run) -> None:
        try:
            self._outcome["result"] = run()
        except Exception as e:  # raised by join
            self._outcome["error"] = e

    def alive(self) -> bool:
        return self._thread.is_alive()

    def join(self):
        self._thread.join()
        if "error" in self._outcome:
            raise self._outcome["error"]
        return self._outcome["result"]


def wait_events(
    events: Path, total: int, job: Background, *, key: str = "succeeded", timeout: float = 60.0
) -> bool:
    """Wait until the batches written to `events` (one JSON line per batch, as
    bench/retrylib_driver.py and bench/bare_driver.py write them) have counted `total` of
    `key` in all; False when the job ended or `timeout` passed first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and job.alive():
        done = sum(
            json.loads(line)["counters"].get(key, 0) for line in events.read_text().splitlines()
        )
        if done >= total:
            return True
        time.sleep(0.1)
    say(f"{events.name}: {key} did not reach {total} (job ended or {timeout:.0f}s passed)")
    return False


def spark_batches(result: dict) -> list[tuple[float, int, float]]:
    """(end epoch s, records, trigger s) of each batch of a Spark contender's result, in
    order.

    Ends and trigger times come from the query's progress (trigger start +
    triggerExecution). Records are retrylib's own counters where there are some (with the
    python source the query's input rows are offset ranges, not records), else the
    progress's input rows.
    """
    ends = batch_ends(result["progress"])
    took = {
        p["batchId"]: p["durationMs"].get("triggerExecution", 0) / 1000
        for p in result["progress"]
        if p.get("batchId") is not None
    }
    if "batches" in result:
        batches = [
            (
                ends.get(b["batch_id"], b["end"]),
                b["counters"].get("records_main", 0) + b["counters"].get("records_retry", 0),
                took.get(b["batch_id"], b["duration_ms"] / 1000),
            )
            for b in result["batches"]
        ]
    else:
        batches = [
            (ends[p["batchId"]], p["numInputRows"] or 0, took[p["batchId"]])
            for p in result["progress"]
            if p.get("batchId") in ends
        ]
    return sorted(batches)


def _share(ms: float, whole_ms: float) -> str:
    return f"{ms / 1000:.1f}s {100 * ms / whole_ms:.0f}%" if whole_ms else "-"


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
            from retrylib.dev.broker import EmbeddedBroker

            broker = EmbeddedBroker(data_dir=workdir / "broker").start()
            bootstrap = broker.bootstrap_servers
            broker_pid = broker._process.pid if broker._process else None
        say(f"workdir {workdir}; broker {bootstrap}")
        bench = Bench(args, workdir, bootstrap, broker_pid)
        if set(args.only) & THROUGHPUT_PARTS:
            bench.produce()
            bench.run_throughput()
        if "lateness" in args.only:
            bench.run_lateness()
        if "lanes" in args.only:
            bench.run_lanes()
        if "storm" in args.only:
            bench.run_storm()
        if "fixed_cost" in args.only:
            bench.run_fixed_cost()
        if "outside" in args.only:
            bench.run_outside()
        text = bench.report()
        print(text)
        if args.json:
            Path(args.json).write_text(
                json.dumps(
                    {
                        "args": vars(args),
                        "input": bench.input,
                        "storm_input": bench.storm_input,
                        "fixed_cost": bench.fixed,
                        "runs": bench.results,
                    }
                )
            )
        return 0
    finally:
        if broker is not None:
            broker.stop()
        if own_workdir and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
