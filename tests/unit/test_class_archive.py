"""spark-submit.sh's class archive (retrylib/dev/class_archive.py): which JVM options a run
gets, what the archive's name depends on, and that only a JVM that exited 0 leaves one."""

from __future__ import annotations

import fcntl
import os
import subprocess
import time
from pathlib import Path

import pytest
from helpers import JVM_OPTIONS

from retrylib.dev import class_archive
from retrylib.dev.class_archive import (
    archive_path,
    make_archive,
    submit_options,
    tree_cpu_seconds,
    wait_for_start,
)

# Stands in for spark-submit: writes the archive its JVM options name, then exits FAKE_EXIT.
FAKE_SUBMIT = """#!/bin/sh
for option in $SPARK_SUBMIT_OPTS; do
  case $option in -XX:ArchiveClassesAtExit=*) echo classes > "${option#*=}";; esac
done
echo "$@" > "$FAKE_ARGS"
exit "${FAKE_EXIT:-0}"
"""


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """A Java and a Spark of files, an archive folder, and a fake spark-submit."""
    java = tmp_path / "jdk" / "bin" / "java"
    (tmp_path / "jdk" / "lib" / "server").mkdir(parents=True)
    java.parent.mkdir(parents=True)
    java.write_text("")
    (tmp_path / "jdk" / "lib" / "server" / "libjvm.so").write_text("jvm")
    (tmp_path / "spark" / "jars").mkdir(parents=True)
    (tmp_path / "spark" / "jars" / "spark-core_2.13-4.2.0.jar").write_text("core")
    submit = tmp_path / "spark-submit"
    submit.write_text(FAKE_SUBMIT)
    submit.chmod(0o755)
    return {
        "PATH": os.environ["PATH"],
        "JAVA_HOME": str(tmp_path / "jdk"),
        "SPARK_HOME": str(tmp_path / "spark"),
        "RETRYLIB_CLASS_ARCHIVE": str(tmp_path / "archives"),
        "FAKE_ARGS": str(tmp_path / "args"),
    }


def command(env: dict[str, str]) -> list[str]:
    return [str(Path(env["SPARK_HOME"]).parent / "spark-submit"), "--jars", "delta.jar"]


def run(env: dict[str, str]) -> list[str]:
    """What the maker runs the workload with: the command, on a local master."""
    return [*command(env), "--master", "local[2]"]


def test_the_callers_own_sharing_options_are_left_alone(env):
    own = f"{JVM_OPTIONS} -XX:SharedArchiveFile=/venv/tests.jsa -Xlog:cds*=off"
    loader = "-Djava.system.class.loader=my.Loader"  # the JVM would warn of the archive
    for options in (own, "-Xshare:off", "-XX:ArchiveClassesAtExit=/tmp/a.jsa", loader):
        assert submit_options({**env, "SPARK_SUBMIT_OPTS": options}, command(env)) == options
    assert submit_options({**env, "RETRYLIB_CLASS_ARCHIVE": "off"}, command(env)) == ""


def test_an_archive_is_mapped_quietly_before_the_callers_options(env, tmp_path):
    env["RETRYLIB_CLASS_ARCHIVE"] = str(tmp_path / "with space")
    archive = archive_path(env, command(env))
    archive.parent.mkdir()
    archive.write_text("made")
    options = submit_options({**env, "SPARK_SUBMIT_OPTS": JVM_OPTIONS}, command(env))
    assert options == f"'-XX:SharedArchiveFile={archive}' -Xlog:cds*=off {JVM_OPTIONS}"


def test_the_archive_name_changes_with_java_spark_jars_and_flags(env, tmp_path):
    first = archive_path(env, command(env))
    assert first.parent == tmp_path / "archives" and first.name.startswith("driver-")
    assert archive_path(env, command(env)) == first
    assert archive_path(env, [*command(env), "--conf", "a=b"]) != first
    jar = tmp_path / "spark" / "jars" / "spark-core_2.13-4.2.0.jar"
    os.utime(jar, ns=(1, 1))  # the JVM refuses an archive of a jar with another time
    assert archive_path(env, command(env)) != first
    second = archive_path(env, command(env))
    (tmp_path / "jdk" / "lib" / "server" / "libjvm.so").write_text("another build")
    assert archive_path(env, command(env)) not in (first, second)


def test_a_run_without_an_archive_starts_making_one_unless_that_failed_lately(env, monkeypatch):
    started = []
    monkeypatch.setattr(class_archive.subprocess, "Popen", lambda args, **kw: started.append(args))
    options = {**env, "SPARK_SUBMIT_OPTS": JVM_OPTIONS}
    assert submit_options(options, command(env), job=4321) == JVM_OPTIONS
    archive = archive_path(env, command(env))
    made = ["--make", str(archive), "--job", "4321", "--", *command(env)]
    assert started[0][-len(made) :] == made
    archive.with_name(f"{archive.name}.failed").write_text("exit 1")
    submit_options(env, command(env))
    assert len(started) == 1


def test_the_archive_appears_only_when_its_jvm_exited_zero(env, tmp_path):
    archive = archive_path(env, command(env))
    archive.parent.mkdir()
    killed = archive.with_name(f"{archive.name}.99999.partial")  # a maker killed while writing
    killed.write_text("half")
    assert not make_archive(archive, run(env), {**env, "FAKE_EXIT": "1"})
    assert not archive.exists() and not killed.exists()
    assert not list(archive.parent.glob("*.partial"))
    assert archive.with_name(f"{archive.name}.failed").read_text().startswith("exit 1")

    old = archive.with_name("driver-4.1.0-0000000000000000.jsa")
    older = archive.with_name("driver-4.0.0-0000000000000000.jsa")
    for file, when in ((older, 1), (old, 2)):
        file.write_text("classes")
        os.utime(file, (when, when))
    assert make_archive(archive, run(env), env)
    assert archive.read_text() == "classes\n"
    assert not archive.with_name(f"{archive.name}.failed").exists()
    assert sorted(p.name for p in archive.parent.glob("*.jsa")) == sorted([old.name, archive.name])
    script, data = Path(env["FAKE_ARGS"]).read_text().split()[-2:]
    assert Path(script).name == "workload.py" and Path(data).name == "data"


def test_a_workload_past_its_bound_counts_as_failed(env, monkeypatch):
    archive = archive_path(env, command(env))
    archive.parent.mkdir()
    monkeypatch.setattr(class_archive, "WORKLOAD_TIMEOUT_S", 0.5)
    sleeper = Path(env["SPARK_HOME"]).parent / "slow-submit"
    # As spark-submit does, the script runs what does the work as a child of its own.
    child_pid = Path(env["SPARK_HOME"]).parent / "child.pid"
    sleeper.write_text(f"#!/bin/sh\nsleep 30 &\necho $! > {child_pid}\nwait\n")
    sleeper.chmod(0o755)
    started = time.monotonic()
    assert not make_archive(archive, [str(sleeper)], env)
    assert time.monotonic() - started < 10
    assert not archive.exists() and not list(archive.parent.glob("*.partial"))
    assert "ran past" in archive.with_name(f"{archive.name}.failed").read_text()
    assert not running(int(child_pid.read_text()))


def running(pid: int) -> bool:
    """True while process `pid` runs (a zombie, killed and not yet reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_a_second_maker_leaves_while_the_first_holds_the_lock(env):
    archive = archive_path(env, command(env))
    archive.parent.mkdir()
    with open(archive.with_name(f"{archive.name}.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        assert not make_archive(archive, run(env), env)
    assert not archive.exists() and not Path(env["FAKE_ARGS"]).exists()


def test_without_a_java_to_key_it_by_the_helper_prints_the_callers_options(tmp_path):
    done = subprocess.run(
        [class_archive.sys.executable, "-m", "retrylib.dev.class_archive", "--", "x"],
        env={**os.environ, "SPARK_SUBMIT_OPTS": "-Xmx1g", "JAVA_HOME": str(tmp_path / "none")},
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout == "-Xmx1g\n"


def test_the_maker_waits_for_a_jobs_start_by_its_processes_cpu_time():
    spun = subprocess.run(
        [class_archive.sys.executable, "-c", "import time\nend = time.process_time() + 0.3\n"
         "while time.process_time() < end: pass"],
    )  # fmt: skip
    assert spun.returncode == 0
    own = os.times()
    # Its own time and its children's, the spinning one's gone into its count.
    assert tree_cpu_seconds(os.getpid()) >= own.user + own.system + 0.25
    assert tree_cpu_seconds(2**22 + 1) is None  # above the kernel's largest pid
    waited = time.monotonic()
    wait_for_start(2**22 + 1, window_s=5)  # a job that is gone has started
    assert time.monotonic() - waited < 1
