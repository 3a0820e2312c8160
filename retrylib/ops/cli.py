"""The `retrylib` command: run the job, check a config, show status, redrive dead letters,
run the embedded demo.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from typing import TextIO

from confluent_kafka import KafkaException

from retrylib.batch.spark_errors import spark_error_line
from retrylib.errors import ConfigError, RetrylibError
from retrylib.kafka.clients import kafka_error_text
from retrylib.logs import configure_logging, redact

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_CONFIG = 2

_EXIT_CODES = """\
exit codes:
  0  success
  1  failure: the job failed; check found a missing topic, (with --tables) a mismatched
     table or (with --require-broker) no broker; status could not reach the broker; a
     redrive failed; Spark could not read or update a table
  2  bad usage or invalid config (every problem is listed, each naming its key)

environment:
  RETRYLIB_LOG_LEVEL   retrylib's log level: DEBUG, INFO (default), WARNING, ERROR
  RETRYLIB_LOG_FORMAT  text (default) or json (one object per line)
"""


def _parser() -> argparse.ArgumentParser:
    def command(
        name: str, summary: str, details: str = "", *, config: bool = True
    ) -> argparse.ArgumentParser:
        """A subcommand; with `config`, its first argument is the job's config file."""
        sub = commands.add_parser(
            name,
            help=summary,
            description=summary + (f"\n\n{details}" if details else ""),
            epilog=_EXIT_CODES,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        if config:
            sub.add_argument("config", help="path of the job's TOML config")
        return sub

    def broker_timeout(sub: argparse.ArgumentParser) -> None:
        sub.add_argument(
            "--timeout", type=_positive, default=5.0, help="seconds to wait for the broker (5)"
        )

    parser = argparse.ArgumentParser(
        prog="retrylib",
        description="Kafka retries with delays, a dead-letter path and exactly-once Delta output.",
        epilog=_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = command("run", "run the job described by a config file")
    run.add_argument(
        "--available-now",
        action="store_true",
        help="process what is in Kafka now (and due), then exit 0",
    )
    run.add_argument(
        "--master", help="Spark master when not launched by spark-submit, e.g. local[2]"
    )

    check = command(
        "check",
        "validate a config without starting Spark",
        "Lists every config problem at once. When the config is valid and the broker answers,\n"
        "also checks that the main topics exist and which other topics the job would create.\n"
        "An unreachable broker is a warning. With --tables, also starts Spark to check that\n"
        "existing tables have the columns the job writes (a missing table is a note: the job\n"
        "creates it on start).",
    )
    check.add_argument(
        "--require-broker",
        action="store_true",
        help="fail (exit 1) when the broker does not answer",
    )
    check.add_argument(
        "--offline",
        action="store_true",
        help="check the config away from where the job runs (a laptop, CI): no broker, no "
        "tables, and local paths not looked at (they are the cluster's)",
    )
    broker_timeout(check)
    check.add_argument(
        "--show", action="store_true", help="print the resolved config (secrets as ***) as JSON"
    )
    check.add_argument(
        "--tables",
        action="store_true",
        help="also check the Delta tables' columns (starts Spark: local[1] unless spark-submit)",
    )

    status = command(
        "status",
        "show what the job holds: retry tiers, dead letters, last batches",
        "Retry tiers: records waiting, how many are due, the oldest one's age, when the next\n"
        "is due (read from the tier topics past the job's checkpointed position). Dead\n"
        "letters by error class (from the dead-letter table). Last batches' figures (from the\n"
        "metrics table, else the checkpoint's manifests). Changes nothing. The tables are read\n"
        "through Spark (local[1] unless launched by spark-submit), a path or a catalog name.",
    )
    status.add_argument("--json", action="store_true", help="print JSON for scripts")
    status.add_argument("--batches", type=int, default=5, help="how many last batches (5)")
    broker_timeout(status)

    redrive = command(
        "redrive",
        "send dead-lettered records back to their main topic",
        "Each chosen record goes back once, with its key, value and own headers (retrylib.*\n"
        "headers dropped), to its origin topic or --to; the dead-letter table records it\n"
        "(redrive_id, redrive_topic, redriven_at), so running it again sends nothing twice.\n"
        "A redrive interrupted by a crash is finished by the next run. Filters combine with\n"
        "AND; --error-class, --id, --topic and --key may repeat (OR within each). Times are\n"
        "ISO 8601, UTC unless they carry an offset. The table is read and updated through\n"
        "Spark (local[1] unless launched by spark-submit).",
    )
    redrive.add_argument("--to", metavar="TOPIC", help="send to this topic instead of the origin")
    redrive.add_argument(
        "--since", type=_moment, metavar="ISO", help="dead-lettered at or after this time"
    )
    redrive.add_argument("--until", type=_moment, metavar="ISO", help="dead-lettered before this")
    redrive.add_argument(
        "--error-class",
        action="append",
        default=[],
        metavar="CLS",
        help="e.g. builtins.ValueError, or just ValueError",
    )
    redrive.add_argument(
        "--id", action="append", default=[], metavar="ID", help="a dead-letter row id"
    )
    redrive.add_argument(
        "--topic", action="append", default=[], metavar="TOPIC", help="the record's origin topic"
    )
    redrive.add_argument(
        "--key", action="append", default=[], metavar="KEY", help="the record's key (UTF-8 text)"
    )
    redrive.add_argument("--partition", type=int, metavar="N", help="the record's origin partition")
    redrive.add_argument(
        "--offsets",
        type=_offset_range,
        metavar="FIRST-LAST",
        help="its origin offsets, both included (with --partition)",
    )
    redrive.add_argument(
        "--limit",
        type=int,
        metavar="N",
        help="at most N records, the oldest dead letters first; run again for the next N",
    )
    redrive.add_argument(
        "--again",
        action="store_true",
        help="also records redriven dead_letter.max_redrives times already (they came back)",
    )
    redrive.add_argument(
        "--rate",
        type=float,
        metavar="R",
        help="send at most R records a second (and at most 10 minutes' worth a run)",
    )
    redrive.add_argument(
        "--dry-run", action="store_true", help="show what would be sent; change nothing"
    )
    redrive.add_argument("--json", action="store_true", help="print JSON for scripts")

    demo = command("demo", "run the embedded end-to-end demo", config=False)
    demo.add_argument("--records", type=int, default=200, help="sample orders to produce")
    demo.add_argument("--workdir", default=".retrylib/demo", help="where tables and state go")
    return parser


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds above 0, got {text!r}")
    return value


def _moment(text: str) -> datetime:
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an ISO 8601 time like 2026-05-01T12:00:00Z, got {text!r}"
        ) from None


def _offset_range(text: str) -> tuple[int, int]:
    first, dash, last = text.partition("-")
    if not (dash and first.isdigit() and last.isdigit()):
        raise argparse.ArgumentTypeError(f"expected FIRST-LAST offsets like 100-199, got {text!r}")
    return int(first), int(last)


def _load(path: str, *, check_imports: bool = True):
    """Load the config and register its secrets for redaction."""
    from retrylib.config.loader import load_config
    from retrylib.logs import redact_secrets

    config = load_config(path, check_imports=check_imports)
    redact_secrets(config.secret_values())
    return config


def _out(text: str, stream: TextIO | None = None) -> None:
    print(redact(text), file=stream or sys.stdout)


def _run(args: argparse.Namespace) -> int:
    from retrylib.job import run

    return run(_load(args.config), available_now=args.available_now, master=args.master)


def _check(args: argparse.Namespace) -> int:
    from retrylib.config.loader import collect_config_errors

    if args.offline:
        return _check_offline(args)
    problems = collect_config_errors(args.config)
    if _config_problems(args.config, problems):
        return EXIT_CONFIG
    config = _load(args.config)
    _out(f"config {args.config}: valid")
    from retrylib.job.kinds import kind_of

    for line in kind_of(config).describe():
        _out(line)
    if args.show:
        _out(json.dumps(config.redacted(), indent=2))
    from retrylib.ops.check import Finding, preflight

    with _stops_new_spark() if args.tables else contextlib.nullcontext():
        reachable, findings = preflight(config, timeout=args.timeout, tables=args.tables)
    if not args.tables:
        findings.append(Finding("note", "tables not checked (--tables checks them with Spark)"))
    for finding in findings:
        stream = sys.stderr if finding.level in ("warning", "error") else sys.stdout
        _out(f"{finding.level}: {finding.message}", stream)
    errors = sum(f.level == "error" for f in findings)
    if not reachable and args.require_broker:
        _out(f"{args.config}: broker required (--require-broker) but not reachable", sys.stderr)
        return EXIT_FAILED
    if errors:
        _out(f"{args.config}: {errors} problem{'s' if errors > 1 else ''} found", sys.stderr)
        return EXIT_FAILED
    _out(f"{args.config}: ok" + ("" if reachable else " (broker not checked)"))
    return EXIT_OK


def _config_problems(path: str, problems: list[str]) -> bool:
    """Print `problems` of the config at `path`, if any; True when there were."""
    for problem in problems:
        _out(f"error: {problem}", sys.stderr)
    if problems:
        count = f"{len(problems)} problem{'s' if len(problems) > 1 else ''}"
        _out(f"{path}: invalid config ({count})", sys.stderr)
    return bool(problems)


def _check_offline(args: argparse.Namespace) -> int:
    """`check --offline`: the config as far as it can be checked away from where it runs."""
    from retrylib.config.loader import check_elsewhere

    if args.tables or args.require_broker:
        _out(
            "error: --offline looks at no broker and no table: drop --tables and --require-broker",
            sys.stderr,
        )
        return EXIT_CONFIG
    problems, unset = check_elsewhere(args.config)
    if _config_problems(args.config, problems):
        return EXIT_CONFIG
    if unset:
        _out(
            f"note: ${{env:...}} variable(s) {', '.join(unset)} not set here: taken as set where "
            "the job runs, and the values holding them not checked"
        )
    _out(
        "note: offline: the broker, the topics, the checkpoint and the tables were not looked "
        "at; `retrylib check` where the job runs checks them"
    )
    _out(f"{args.config}: ok (offline)")
    return EXIT_OK


def _status(args: argparse.Namespace) -> int:
    from retrylib.ops.render import render_status, status_json
    from retrylib.ops.status import collect_status

    config = _load(args.config, check_imports=False)
    with _stops_new_spark():
        status = collect_status(config, batches=args.batches, timeout=args.timeout)
    _out(status_json(status) if args.json else render_status(status))
    return EXIT_OK if status["broker"]["reachable"] else EXIT_FAILED


def _redrive(args: argparse.Namespace) -> int:
    from retrylib.ops.redrive import Selection, redrive
    from retrylib.ops.render import ProgressLine, redrive_json, render_redrive

    config = _load(args.config, check_imports=False)
    selection = Selection(
        args.since,
        args.until,
        tuple(args.error_class),
        tuple(args.id),
        topics=tuple(args.topic),
        keys=tuple(args.key),
        partition=args.partition,
        offsets=args.offsets,
        limit=args.limit,
    )
    progress = None if args.dry_run else ProgressLine("redrive: sent")
    try:
        with _stops_new_spark():
            report = redrive(
                config,
                selection,
                to=args.to,
                rate=args.rate,
                again=args.again,
                dry_run=args.dry_run,
                progress=progress,
            )
    finally:
        if progress is not None:
            progress.close()
    _out(redrive_json(report) if args.json else render_redrive(report))
    return EXIT_OK


@contextlib.contextmanager
def _stops_new_spark() -> Iterator[None]:
    """Stop the SparkSession the block started (status, redrive and check --tables read
    tables through one), and only that: a session running before it (a classic one, or a
    Spark Connect one such as a Databricks notebook's) is left as it was.
    """
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    ran_before = (
        SparkContext._active_spark_context is not None
        or SparkSession.getActiveSession() is not None
    )
    try:
        yield
    finally:
        started = SparkSession.getActiveSession()
        if not ran_before and started is not None:
            started.stop()


def _demo(args: argparse.Namespace) -> int:
    from retrylib.dev.demo import run_demo

    return run_demo(records=args.records, workdir=args.workdir)


_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "run": _run,
    "check": _check,
    "status": _status,
    "redrive": _redrive,
    "demo": _demo,
}


# The commands a job's entry-point script runs besides the job (`script_main`).
_SCRIPT_TOOLS = ("status", "redrive")


def script_main(arguments: Sequence[str]) -> int:
    """Entry point of the scripts a cluster starts (spark-submit's jobs/run_job.py, the
    Databricks task's run_job.py): `CONF [--available-now]` runs the job, `status CONF ...`
    and `redrive CONF ...` that command. Returns the exit code."""
    if arguments and arguments[0] in _SCRIPT_TOOLS:
        return main(arguments)
    return main(["run", *arguments])


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `retrylib` console script; returns the exit code (see
    `_EXIT_CODES`: 0 success, 1 failure, 2 bad usage or invalid config).
    """
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:  # --help (0) or a usage error (2), already printed
        return e.code if isinstance(e.code, int) else EXIT_CONFIG
    configure_logging()
    if _uses_spark(args):
        from retrylib.spark.requirement import driver_pyspark_version, spark_version_problem

        problem = spark_version_problem(driver_pyspark_version())
        if problem:
            _out(f"error: {problem}", sys.stderr)
            return EXIT_CONFIG
    try:
        return _COMMANDS[args.command](args)
    except ConfigError as e:
        _out(f"config error: {e}", sys.stderr)
        return EXIT_CONFIG
    except RetrylibError as e:
        _out(f"error: {e}", sys.stderr)
        return EXIT_FAILED
    except KafkaException as e:
        _out(f"error: Kafka{_brokers_of(args)}: {kafka_error_text(e)}", sys.stderr)
        return EXIT_FAILED
    except Exception as e:
        if not _from_spark(e):
            raise
        text = str(e).strip()
        _out(f"error: Spark: {spark_error_line(text) if text else type(e).__name__}", sys.stderr)
        return EXIT_FAILED


def _uses_spark(args: argparse.Namespace) -> bool:
    """True for a command that starts or joins a Spark session."""
    return args.command in ("run", "status", "redrive", "demo") or (
        args.command == "check" and args.tables
    )


def _from_spark(error: Exception) -> bool:
    """True for an error raised by Spark or Delta (reading or updating a table)."""
    if "pyspark" not in sys.modules:
        return False
    from py4j.protocol import Py4JError
    from pyspark.errors import PySparkException

    return isinstance(error, PySparkException | Py4JError)


def _brokers_of(args: argparse.Namespace) -> str:
    """ " at HOST:PORT (kafka.bootstrap_servers)" for a command's config, or "" if unknown."""
    from retrylib.config.loader import load_config

    path = getattr(args, "config", None)
    if path is None:
        return ""
    try:
        servers = load_config(path, check_imports=False).kafka.bootstrap_servers
    except RetrylibError:
        return ""
    return f" at {servers} (kafka.bootstrap_servers in {path}; is the broker up?)"
