"""A class-data-sharing archive for the driver JVM of spark-submit.sh, on a Spark installed
from PyPI into a virtualenv: `python -m retrylib.dev.class_archive -- SPARK_SUBMIT FLAGS...`
prints the SPARK_SUBMIT_OPTS to run that spark-submit with.

A driver JVM loads and verifies some fifteen thousand classes from Spark's and Delta's jars
before its first batch; mapped from an archive (JDK's AppCDS, `-XX:SharedArchiveFile`) they
cost a fraction of that. Java 17 has no `-XX:+AutoCreateSharedArchive` (JDK 19+): a JVM
writes a dynamic archive as it exits when started with `-XX:ArchiveClassesAtExit`.

Why the archive is made by a JVM of its own, in the background, and not by the job's JVM as
it exits: on OpenJDK 17.0.15 a JVM that maps a truncated archive (its header whole, its
regions cut short, as a JVM killed while writing it leaves one) dies of SIGBUS before its
first line. So an archive may only ever appear complete, renamed into place by a process
that saw the writing JVM exit 0. The job's JVM cannot have such a watcher (spark-submit.sh
execs it: its pid is the JVM's, and the signals that stop a job go to it), a streaming job
may run for weeks before it exits, and writing the archive would lengthen its stop. Instead
the first run that finds no archive runs without one and starts `make_archive` detached,
which waits until that run has started (its processes use under a quarter of a core) and
then runs, at the lowest CPU priority, a small Delta, Python-source and streaming workload
through the same spark-submit and flags, its JVM writing to a pid-named file that is renamed into
place only once that JVM exited 0. A later run maps it.

The archive is valid for one class path and one Java build only: its name holds a hash of
the Java build, Spark's jars (names, sizes, times: the JVM checks the same), the extra jars
and flags, and the workload. A JVM that finds it does not match runs as if there were none,
and `-Xlog:cds*=off` keeps it from saying so on its stdout. It lives in the virtualenv
(`retrylib-class-archive/`, some 200 MB), or in the folder RETRYLIB_CLASS_ARCHIVE names;
RETRYLIB_CLASS_ARCHIVE=off turns it off. A SPARK_SUBMIT_OPTS that names an archive or
`-Xshare` (the tests' own, tests/jvm_class_archive.py) is left as it is.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from importlib import metadata
from importlib.util import find_spec
from pathlib import Path

OFF = {"off", "0", "false", "no"}
WORKLOAD_TIMEOUT_S = 600.0
"""The longest a maker waits for its workload (it then counts as failed)."""
RETRY_AFTER_S = 24 * 3600
"""A workload that failed is tried again after this long (its `.failed` file says why)."""
_CALLERS_OWN = re.compile(
    r"-XX:(SharedArchiveFile|ArchiveClassesAtExit)=|-Xshare:|-Djava\.system\.class\.loader="
)
"""Options that choose class sharing already, or (a class loader of one's own) with which a
JVM warns (on its stderr) that it maps no application class from an archive."""
QUIET = "-Xlog:cds*=off"
"""A JVM on an archive that does not match its class path or Java build prints a warning on
its stdout (the job's output) without this."""

WORKLOAD = """
import sys
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition


class Numbers(DataSource):
    @classmethod
    def name(cls):
        return "class_archive_numbers"

    def schema(self):
        return "id LONG"

    def streamReader(self, schema):
        return NumbersReader()


class NumbersReader(DataSourceStreamReader):
    def initialOffset(self):
        return {"n": 0}

    def latestOffset(self, start=None, limit=None):
        return {"n": 20}

    def partitions(self, start, end):
        return [InputPartition((start["n"], end["n"]))]

    def read(self, partition):
        yield from ((i,) for i in range(*partition.value))


folder = sys.argv[1]
spark = SparkSession.builder.appName("retrylib-class-archive").getOrCreate()
spark.dataSource.register(Numbers)
spark.range(10).write.format("delta").save(f"{folder}/table")
spark.read.format("delta").load(f"{folder}/table").mapInArrow(lambda b: b, "id LONG").count()
(spark.readStream.format("kafka").option("kafka.bootstrap.servers", "localhost:9")
 .option("subscribe", "none").load())


def batch(frame, batch_id):
    # An idempotent append, as the job's: Delta reads the table's transactions first.
    (frame.mapInArrow(lambda b: b, "id LONG").write.format("delta").mode("append")
     .option("txnAppId", "class-archive").option("txnVersion", batch_id).save(f"{folder}/out"))
    spark.read.format("delta").load(f"{folder}/out").count()


query = (spark.readStream.format("class_archive_numbers").load().writeStream
         .foreachBatch(batch).option("checkpointLocation", f"{folder}/checkpoint").start())
query.processAllAvailable()
query.stop()
spark.stop()
"""


def callers_own(options: str) -> bool:
    """True when the JVM options are left as they are (`_CALLERS_OWN`)."""
    return bool(_CALLERS_OWN.search(options))


def java_options(archive: Path, options: str) -> str:
    """`options` with `archive` mapped, quietly; ours first, so that the caller's own
    `-Xlog` settings still win. Quoted as Spark's launcher parses SPARK_SUBMIT_OPTS."""
    mapped = shlex.quote(f"-XX:SharedArchiveFile={archive}")
    return f"{mapped} {QUIET} {options}".strip()


def java_binary(env: Mapping[str, str]) -> Path | None:
    """The java Spark's launcher runs (spark-class): JAVA_HOME's, else the one on PATH."""
    home = env.get("JAVA_HOME")
    found = str(Path(home, "bin", "java")) if home else shutil.which("java", path=env.get("PATH"))
    return Path(found).resolve() if found and Path(found).exists() else None


def spark_home(env: Mapping[str, str]) -> Path | None:
    """The Spark a virtualenv's spark-submit runs: SPARK_HOME, else pyspark's folder."""
    if env.get("SPARK_HOME"):
        return Path(env["SPARK_HOME"])
    spec = find_spec("pyspark")
    locations = spec.submodule_search_locations if spec else None
    return Path(next(iter(locations))) if locations else None


def _stamp(path: Path) -> str:
    try:
        status = path.stat()
    except OSError:
        return f"{path}:missing"
    return f"{path}:{status.st_size}:{status.st_mtime_ns}"


def archive_key(java: Path, spark: Path, command: Sequence[str]) -> str:
    """What an archive is valid for: the Java build (its binary, libjvm and release file),
    Spark's jars as the JVM checks them (name, size, time), the spark-submit command's flags
    (the extra jars), and the workload that makes it."""
    jdk = java.parent.parent
    parts = [_stamp(java), _stamp(jdk / "lib" / "server" / "libjvm.so"), _stamp(jdk / "release")]
    parts += [_stamp(jar) for jar in sorted((spark / "jars").glob("*.jar"))]
    parts += ["--", *command, "--", WORKLOAD]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def archive_folder(env: Mapping[str, str]) -> Path | None:
    """Where archives are kept: RETRYLIB_CLASS_ARCHIVE, else the virtualenv; None: off."""
    chosen = env.get("RETRYLIB_CLASS_ARCHIVE", "")
    if chosen.lower() in OFF:
        return None
    return Path(chosen) if chosen else Path(sys.prefix) / "retrylib-class-archive"


def archive_path(env: Mapping[str, str], command: Sequence[str]) -> Path | None:
    """The archive for a driver JVM started by `command` (spark-submit and its flags), or
    None when there is no Java or Spark to key it by, or archives are off."""
    folder, java, spark = archive_folder(env), java_binary(env), spark_home(env)
    if folder is None or java is None or spark is None:
        return None
    try:
        version = metadata.version("pyspark")
    except metadata.PackageNotFoundError:
        version = "spark"
    return folder / f"driver-{version}-{archive_key(java, spark, command)}.jsa"


def submit_options(env: Mapping[str, str], command: Sequence[str], job: int | None = None) -> str:
    """SPARK_SUBMIT_OPTS for the driver JVM of `command`: the caller's, with the archive
    when there is one. When there is none (and none failed lately) a detached
    `make_archive` is started for the next runs, to begin once process `job` has started."""
    options = env.get("SPARK_SUBMIT_OPTS", "").strip()
    if callers_own(options):
        return options
    archive = archive_path(env, command)
    if archive is None:
        return options
    if archive.is_file():
        return java_options(archive, options)
    if _worth_making(archive):
        maker = [sys.executable, "-m", "retrylib.dev.class_archive", "--make", str(archive)]
        subprocess.Popen(
            [*maker, *(["--job", str(job)] if job else []), "--", *command],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # not in the job's process group: a kill of it spares this
        )
    return options


def _worth_making(archive: Path) -> bool:
    failed = archive.with_name(f"{archive.name}.failed")
    with contextlib.suppress(FileNotFoundError):
        if time.time() - failed.stat().st_mtime < RETRY_AFTER_S:
            return False
    try:
        archive.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(archive.parent, os.W_OK)


def make_archive(
    archive: Path, run: Sequence[str], env: Mapping[str, str], workload: str = WORKLOAD
) -> bool:
    """Run `workload`, a Python script given a folder for its data, with `run` (spark-submit
    and its flags, or an interpreter whose script builds its own session) in a JVM that
    writes its classes to a pid-named file as it exits; rename that into `archive` once the
    JVM exited 0. One maker per archive (a lock; another finds it held and leaves); it also
    clears what killed makers left and all but the newest other archive. True: made; when
    the workload failed, the `.failed` file beside `archive` says why."""
    with open(archive.with_name(f"{archive.name}.lock"), "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        if archive.exists():
            return False
        for stale in archive.parent.glob("*.partial"):  # only written under a lock
            with contextlib.suppress(OSError):
                if not _lock_held(stale.name.split(".jsa.")[0] + ".jsa.lock", archive):
                    stale.unlink()
        partial = archive.with_name(f"{archive.name}.{os.getpid()}.partial")
        options = f"{env.get('SPARK_SUBMIT_OPTS', '')} -XX:ArchiveClassesAtExit={partial} {QUIET}"
        with tempfile.TemporaryDirectory(prefix="retrylib-class-archive-") as folder:
            script = Path(folder, "workload.py")
            script.write_text(workload)
            why = _run_workload(
                [*run, str(script), str(Path(folder, "data"))],
                {**env, "SPARK_SUBMIT_OPTS": options.strip()},
            )
        if why is None and not partial.is_file():
            why = "the workload exited 0, but its JVM wrote no archive"
        failed = archive.with_name(f"{archive.name}.failed")
        if why is not None:
            partial.unlink(missing_ok=True)
            failed.write_text(why)
            return False
        with open(partial, "rb") as written:
            os.fsync(written.fileno())  # whole on disk before its name says it is done
        os.replace(partial, archive)
        failed.unlink(missing_ok=True)
        others = sorted(
            (p for p in archive.parent.glob("driver-*.jsa") if p != archive),
            key=lambda p: p.stat().st_mtime,
        )
        for old in others[:-1]:  # a JVM that mapped one keeps its mapping
            old.unlink(missing_ok=True)
        return True


def _run_workload(command: list[str], env: Mapping[str, str]) -> str | None:
    """Run `command` in a session of its own: None when it exited 0, else why not. Past
    `WORKLOAD_TIMEOUT_S` its whole process group is killed, spark-submit's JVM and the
    Python driver under it included, not only spark-submit."""
    with subprocess.Popen(
        command,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        start_new_session=True,
    ) as process:
        try:
            out, err = process.communicate(timeout=WORKLOAD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            return f"the workload ran past {WORKLOAD_TIMEOUT_S:.0f}s"
    if process.returncode == 0:
        return None
    return f"exit {process.returncode}\n{out[-2000:]}{err[-4000:]}"


def _lock_held(name: str, archive: Path) -> bool:
    """True when another archive's maker holds its lock (its partial is being written)."""
    if name == f"{archive.name}.lock":
        return False  # ours: held by this process
    try:
        with open(archive.with_name(name), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    return False


def tree_cpu_seconds(pid: int) -> float | None:
    """CPU seconds used by process `pid` and its descendants (those gone included), from
    /proc; None when there is no such process."""
    ticks, parents, used = os.sysconf("SC_CLK_TCK"), {}, {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents[int(stat.parent.name)] = int(fields[1])
            used[int(stat.parent.name)] = sum(int(f) for f in fields[11:15]) / ticks
    if pid not in used:
        return None
    tree, grown = {pid}, True
    while grown:
        more = {child for child, parent in parents.items() if parent in tree} - tree
        tree, grown = tree | more, bool(more)
    return sum(used[p] for p in tree)


def wait_for_start(job: int, window_s: float = 10.0, longest_s: float = 600.0) -> None:
    """Until process `job` (the run that found no archive: its JVM, Python driver and
    workers) has ended or used under a quarter of a core over `window_s`, at most
    `longest_s`: a job's start is its busiest time, and the workload would slow it down."""
    waited, last = 0.0, tree_cpu_seconds(job)
    while last is not None and waited < longest_s:
        time.sleep(window_s)
        waited += window_s
        now = tree_cpu_seconds(job)
        if now is None or now - last < window_s / 4:
            return
        last = now


def main(argv: Sequence[str] | None = None) -> int:
    """`[--job PID] -- SUBMIT FLAGS...`: print the SPARK_SUBMIT_OPTS (the caller's, whatever
    goes wrong); `--make ARCHIVE [--job PID] -- SUBMIT FLAGS...`: make the archive once
    process PID has started (run detached by the former)."""
    args = list(sys.argv[1:] if argv is None else argv)
    split = args.index("--") if "--" in args else len(args)
    command, options = args[split + 1 :], args[:split]
    job = int(options[options.index("--job") + 1]) if "--job" in options else None
    if options[:1] == ["--make"]:
        # After the job's start, at the lowest CPU priority, inherited by the JVM. A process
        # that leads a session of its own is an autogroup of its own too, where it is nice
        # only among its own processes: that group is made nice as well.
        os.nice(19)
        with contextlib.suppress(OSError):
            Path("/proc/self/autogroup").write_text("19")
        if job:
            wait_for_start(job)
        made = make_archive(Path(options[1]), [*command, "--master", "local[2]"], os.environ)
        return 0 if made else 1
    try:
        print(submit_options(os.environ, command, job))
    except Exception:  # the job runs as before, without an archive
        print(os.environ.get("SPARK_SUBMIT_OPTS", "").strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
