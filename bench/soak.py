"""A soak run: the job for a long time at a steady rate, checking that nothing only grows.
Run by hand (not a test):

    .venv/bin/python -m bench.soak --minutes 30 --every 5 --rate 200

Starts an embedded Apache Kafka broker, launches the job as users run it
(`./spark-submit.sh CONFIG` in a process of its own, `local[2]`), and keeps producing
`--rate` records a second to one topic from a thread: `--failure-rate` of them fail once,
`--dead-rate` fail on every attempt (dead letters; handler `bench.handlers:soak`). Every
`--every` minutes it prints a row: records so far, driver (Python), JVM and Python worker
RSS, open files, the checkpoint's size and files, and each Delta table's files. At the end
it prints the tables with a verdict per column (`bench.report.trend`: flat, bounded or
growing, the last third of the samples against the middle third) and stops the job with
SIGTERM to its driver, as Ctrl-C would, waiting for it to exit. See bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.data import marked_value, soak_mark
from bench.procmem import _all_stats, _read, descendants, parse_kb
from bench.report import fmt, table, trend
from tests.helpers import write_job_toml

REPO = Path(__file__).resolve().parents[1]
TOPIC = "soak"
JOB = "soak"
_METRICS_MARK = " retrylib.metrics: "
_MB = 1024 * 1024


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=30.0, help="how long the job runs (30)")
    p.add_argument("--every", type=float, default=5.0, help="minutes between rows (5)")
    p.add_argument("--rate", type=int, default=200, help="records produced per second (200)")
    p.add_argument("--failure-rate", type=float, default=0.05, help="share failing once (0.05)")
    p.add_argument("--dead-rate", type=float, default=0.002, help="share always failing (0.002)")
    p.add_argument("--record-bytes", type=int, default=200, help="bytes per value (200)")
    p.add_argument("--partitions", type=int, default=3, help="input topic partitions (3)")
    p.add_argument("--trigger", default="1s", help="job.trigger (1s)")
    p.add_argument("--delays", default="5s,30s", help="retry.delays, comma-separated (5s,30s)")
    p.add_argument(
        "--optimize-every", default="2m", help='output.optimize_every ("2m"; "" for none)'
    )
    p.add_argument("--master", default="local[2]", help="Spark master (local[2])")
    p.add_argument(
        "--spark-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting for the job (repeatable), e.g. "
        "spark.sql.streaming.minBatchesToRetain=10 to see Spark's log retention in a short run",
    )
    p.add_argument("--workdir", help="checkpoint, tables, logs and broker data (a temp dir)")
    p.add_argument("--json", help="also write every sample to this file")
    return p.parse_args(argv)


def say(message: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def write_config(args: argparse.Namespace, workdir: Path, bootstrap: str) -> Path:
    return write_job_toml(
        workdir / "soak.toml",
        topics=[TOPIC],
        name=JOB,
        bootstrap_servers=bootstrap,
        handler={
            "function": "bench.handlers:soak",
            "output_schema": "partition INT, offset BIGINT, size INT",
            "paths": [REPO],
        },
        job={"trigger": args.trigger},
        kafka={"starting_offsets": "earliest"},
        output={"table": f"{workdir}/tables/out", "optimize_every": args.optimize_every or None},
        retry={
            "delays": [d.strip() for d in args.delays.split(",") if d.strip()],
            "max_attempts": 3,
        },
        dead_letter={"table": f"{workdir}/tables/dead_letter"},
        metrics={"table": f"{workdir}/tables/metrics"},
    )


class SteadyProducer(threading.Thread):
    """Produces `rate` records a second until stopped, marked with `soak_mark`."""

    def __init__(self, bootstrap: str, args: argparse.Namespace) -> None:
        super().__init__(daemon=True, name="soak-producer")
        from confluent_kafka import Producer

        self.args = args
        self.produced = 0
        self.marks: dict[bytes, int] = {}
        self._halt = threading.Event()
        self._producer = Producer(
            {"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 20}
        )

    def run(self) -> None:
        a = self.args
        started = time.monotonic()
        while not self._halt.wait(0.05):
            due = int((time.monotonic() - started) * a.rate)
            while self.produced < due:
                i = self.produced
                mark = soak_mark(i, a.failure_rate, a.dead_rate)
                self._producer.produce(
                    TOPIC,
                    key=b"k%d" % i,
                    value=marked_value(i, a.record_bytes, mark),
                    partition=i % a.partitions,
                )
                self.marks[mark] = self.marks.get(mark, 0) + 1
                self.produced += 1
            self._producer.poll(0)
        self._producer.flush(60)

    def stop(self) -> None:
        self._halt.set()
        self.join()


@dataclass
class JobLog:
    """Sums the job's per-batch metrics lines (logger `retrylib.metrics`) read so far."""

    path: Path
    totals: dict[str, int] = field(default_factory=dict)
    batches: int = 0
    compactions: int = 0
    _offset: int = 0
    _durations: list[int] = field(default_factory=list)

    def read(self) -> list[int]:
        """Read what the job logged since the last call; the batch durations (ms) in it."""
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            data = f.read()
        end = data.rfind(b"\n") + 1  # leave a line being written for the next call
        self._offset += end
        durations = []
        for line in data[:end].decode("utf-8", errors="replace").splitlines():
            if "compacted the " in line:
                self.compactions += 1
            _, found, text = line.partition(_METRICS_MARK)
            if not found:
                continue
            try:
                row = json.loads(text)
            except ValueError:
                continue
            self.batches += 1
            durations.append(int(row.get("duration_ms") or 0))
            for name in ("records_main", "records_retry", "succeeded", "dead_lettered"):
                self.totals[name] = self.totals.get(name, 0) + int(row.get(name) or 0)
        return durations


def process_role(comm: str, cmdline: str) -> str | None:
    """A process of the job's tree as "jvm", "driver" (the Python driver running the job's
    entry point), "source" (the Python process in which Spark runs the retry tiers' stream
    reader) or "workers" (Spark's Python daemon and workers); None for anything else (the
    launcher's shell, short-lived helpers)."""
    if comm == "java":
        return "jvm"
    if "python" not in comm and "python" not in cmdline.split(" ", 1)[0]:
        return None
    if "run_job.py" in cmdline:
        return "driver"
    return "source" if "python_streaming_source_runner" in cmdline else "workers"


def job_processes(root: int) -> dict[str, list[int]]:
    """The pids of the job's tree under `root`, by `process_role`."""
    stats = _all_stats()
    if root not in stats:
        return {}
    groups: dict[str, list[int]] = {}
    for pid in descendants(root, {p: s[1] for p, s in stats.items()}):
        cmdline = (_read(f"/proc/{pid}/cmdline") or "").replace("\0", " ")
        kind = process_role(stats[pid][0], cmdline)
        if kind is not None:
            groups.setdefault(kind, []).append(pid)
    return groups


def rss_mb(pids: list[int]) -> float:
    kb = sum(parse_kb(_read(f"/proc/{pid}/status") or "", "VmRSS") or 0 for pid in pids)
    return kb / 1024


def open_files(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            total += len(os.listdir(f"/proc/{pid}/fd"))
        except OSError:
            continue
    return total


def heap_used_mb(heap_info: str) -> float | None:
    """MiB in use from the text of `jcmd PID GC.heap_info` (its first "used NK"), or None."""
    match = re.search(r"\bused (\d+)K", heap_info)
    return None if match is None else int(match.group(1)) / 1024


def live_heap_mb(pid: int) -> float | None:
    """The JVM's heap in use right after a full collection (`jcmd PID GC.run`): what it
    holds on to, where RSS only shows what the heap has grown to. None without jcmd."""
    try:
        subprocess.run(["jcmd", str(pid), "GC.run"], capture_output=True, timeout=120)
        info = subprocess.run(
            ["jcmd", str(pid), "GC.heap_info"], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return heap_used_mb(info.stdout)


def checkpoint_figures(checkpoint: Path) -> dict[str, int]:
    """Bytes and files under the checkpoint; retrylib's manifests and staging folders;
    Spark's offset and commit log files (hidden checksum files left out)."""
    size = files = 0
    for folder, _, names in os.walk(checkpoint):
        for name in names:
            try:
                size += os.path.getsize(os.path.join(folder, name))
            except OSError:
                continue
            files += 1

    def entries(*parts: str) -> int:
        try:
            return sum(1 for n in os.listdir(checkpoint.joinpath(*parts)) if not n.startswith("."))
        except OSError:
            return 0

    return {
        "ckpt_kb": size // 1024,
        "ckpt_files": files,
        "manifests": entries("retrylib", "manifests"),
        "staged": entries("retrylib", "staged"),
        "offsets": entries("spark", "offsets"),
        "commits": entries("spark", "commits"),
    }


def table_figures(path: Path) -> tuple[int | None, int | None]:
    """(data files in the current snapshot, files in `_delta_log`) of the Delta table."""
    from deltalake import DeltaTable

    try:
        log_files = len(os.listdir(path / "_delta_log"))
        return len(DeltaTable(str(path)).file_uris()), log_files
    except Exception:  # not created yet, or a commit being written
        return None, None


PROCESS_COLUMNS = (
    ("min", "elapsed minutes"),
    ("produced", "records produced"),
    ("handled", "main-topic records handled"),
    ("backlog", "produced - handled"),
    ("retried in", "retry records handled"),
    ("dead", "dead-lettered"),
    ("batches", "batches in the interval"),
    ("batch s", "mean batch duration in the interval"),
    ("driver MB", "RSS of the Python driver"),
    ("JVM MB", "RSS of the JVM"),
    ("heap MB", "JVM heap in use after a full GC"),
    ("workers MB", "RSS of Spark's Python workers, summed"),
    ("workers", "Python worker processes"),
    ("source MB", "RSS of the Python process running the tiers' stream reader"),
    ("fds", "open files: driver + JVM"),
)
STORAGE_COLUMNS = (
    ("min", "elapsed minutes"),
    ("ckpt KB", "checkpoint bytes / 1024"),
    ("ckpt files", "files in the checkpoint"),
    ("manifests", "retrylib manifests"),
    ("staged", "retrylib staging folders"),
    ("offsets", "Spark offset log files"),
    ("commits", "Spark commit log files"),
    ("out files", "output: data files in the snapshot"),
    ("out log", "output: files in _delta_log"),
    ("dlq files", "dead letter: data files"),
    ("dlq log", "dead letter: _delta_log files"),
    ("metr files", "metrics: data files"),
    ("metr log", "metrics: _delta_log files"),
)
# Totals that only grow by design: no verdict.
CUMULATIVE = {"min", "produced", "handled", "retried in", "dead"}


def sample(
    started: float, root: int, producer: SteadyProducer, log: JobLog, workdir: Path
) -> dict[str, float | int | None]:
    durations = log.read()
    groups = job_processes(root)
    row: dict[str, float | int | None] = {
        "min": round((time.monotonic() - started) / 60, 1),
        "produced": producer.produced,
        "handled": log.totals.get("records_main", 0),
        "retried in": log.totals.get("records_retry", 0),
        "dead": log.totals.get("dead_lettered", 0),
        "batches": len(durations),
        "batch s": round(sum(durations) / len(durations) / 1000, 2) if durations else None,
        "driver MB": round(rss_mb(groups.get("driver", [])), 1),
        "JVM MB": round(rss_mb(groups.get("jvm", [])), 1),
        "heap MB": _rounded(sum_or_none(live_heap_mb(pid) for pid in groups.get("jvm", []))),
        "workers MB": round(rss_mb(groups.get("workers", [])), 1),
        "workers": len(groups.get("workers", [])),
        "source MB": round(rss_mb(groups.get("source", [])), 1),
        "fds": open_files(groups.get("driver", []) + groups.get("jvm", [])),
    }
    row["backlog"] = int(row["produced"]) - int(row["handled"])  # type: ignore[arg-type]
    figures = checkpoint_figures(workdir / "checkpoint")
    row.update(
        {
            "ckpt KB": figures["ckpt_kb"],
            "ckpt files": figures["ckpt_files"],
            "manifests": figures["manifests"],
            "staged": figures["staged"],
            "offsets": figures["offsets"],
            "commits": figures["commits"],
        }
    )
    for short, name in (("out", "out"), ("dlq", "dead_letter"), ("metr", "metrics")):
        row[f"{short} files"], row[f"{short} log"] = table_figures(workdir / "tables" / name)
    return row


def sum_or_none(values) -> float | None:
    found = list(values)
    return None if not found or None in found else sum(found)


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def table_check(workdir: Path) -> str:
    """Rows and distinct records in the output and dead-letter tables after the stop: equal
    counts mean no record was written twice."""
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    out = DeltaTable(str(workdir / "tables" / "out")).to_pyarrow_table(
        columns=["partition", "offset"]
    )
    dead = DeltaTable(str(workdir / "tables" / "dead_letter")).to_pyarrow_table(columns=["id"])
    pairs = pc.binary_join_element_wise(
        pc.cast(out["partition"], "string"), pc.cast(out["offset"], "string"), ":"
    )
    return (
        f"output table: {out.num_rows:,} rows, {pc.count_distinct(pairs).as_py():,} distinct "
        f"records; dead-letter table: {dead.num_rows:,} rows, "
        f"{pc.count_distinct(dead['id']).as_py():,} distinct ids"
    )


def report(rows: list[dict], columns: tuple[tuple[str, str], ...], title: str) -> str:
    names = [name for name, _ in columns]
    body = [[row.get(name) for name in names] for row in rows]
    verdicts = [
        "-" if name in CUMULATIVE else trend([row.get(name) for row in rows]) for name in names
    ]
    verdicts[0] = "verdict"
    legend = "; ".join(f"{name}: {meaning}" for name, meaning in columns[1:])
    return table(names, [*body, verdicts], title=title) + "\n" + legend


def stop_job(job: subprocess.Popen, root_groups: dict[str, list[int]]) -> int:
    """SIGTERM to the job's Python driver (the job stops after its batch and exits 0, and
    spark-submit with it); the whole process group is killed if it has not exited in 5 min."""
    for pid in root_groups.get("driver", []):
        os.kill(pid, signal.SIGTERM)
    try:
        return job.wait(300)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        return job.wait()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from retrylib.dev.broker import EmbeddedBroker
    from retrylib.kafka.clients import ensure_topics, make_admin

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="retrylib-soak-"))
    workdir.mkdir(parents=True, exist_ok=True)
    say(f"workdir {workdir}")
    broker = EmbeddedBroker(workdir / "broker").start()
    try:
        bootstrap = broker.bootstrap_servers
        ensure_topics(make_admin(bootstrap, {}), {TOPIC: args.partitions}, create=True)
        config = write_config(args, workdir, bootstrap)
        return run(args, workdir, bootstrap, config)
    finally:
        broker.stop()


def run(args: argparse.Namespace, workdir: Path, bootstrap: str, config: Path) -> int:
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "RETRYLIB_SPARK_EXTRA": " ".join(
            [f"--master {args.master}", *(f"--conf {setting}" for setting in args.spark_conf)]
        ),
    }
    log_path = workdir / "job.log"
    producer = SteadyProducer(bootstrap, args)
    log = JobLog(log_path)
    rows: list[dict] = []
    with open(log_path, "wb") as out:
        job = subprocess.Popen(
            [str(REPO / "spark-submit.sh"), str(config)],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C here reaches the soak, which stops the job
        )
    say(f"job started (pid {job.pid}, log {log_path}); producing {args.rate} records/s")
    producer.start()
    started = time.monotonic()
    end = started + args.minutes * 60
    next_row = started + args.every * 60
    interrupted = False
    try:
        while time.monotonic() < end and job.poll() is None:
            if time.monotonic() >= next_row:
                row = sample(started, job.pid, producer, log, workdir)
                rows.append(row)
                print(" ".join(f"{k}={fmt(v)}" for k, v in row.items()), flush=True)
                next_row += args.every * 60
            time.sleep(min(5.0, max(0.1, next_row - time.monotonic())))
        if job.poll() is None:
            rows.append(sample(started, job.pid, producer, log, workdir))
    except KeyboardInterrupt:
        interrupted = True
        say("interrupted: stopping the job")
    producer.stop()
    crashed = job.poll()
    code = crashed if crashed is not None else stop_job(job, job_processes(job.pid))
    log.read()
    print()
    print(report(rows, PROCESS_COLUMNS, "Records and processes"))
    print()
    print(report(rows, STORAGE_COLUMNS, "Checkpoint and Delta tables (files)"))
    print()
    print(
        f"produced {producer.produced:,} ({producer.marks}); job totals {log.totals}; "
        f"{log.batches} batches; {log.compactions} table compactions; job exit code {code}"
        + (" (it stopped before the end)" if crashed is not None else "")
    )
    print(table_check(workdir))
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "totals": log.totals}, indent=1))
    if crashed is not None or code != 0:
        tail = log_path.read_text(errors="replace")[-3000:]
        print(f"job log tail:\n{tail}", file=sys.stderr)
        return 1
    return 130 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
