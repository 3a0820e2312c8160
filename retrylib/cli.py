"""The `retrylib` command: run the job, validate a config, run the embedded demo."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from retrylib.errors import ConfigError, RetrylibError
from retrylib.logs import configure_logging

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_CONFIG = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="retrylib",
        description="Kafka retries with delays, a dead-letter path and exactly-once Delta output.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run the job described by a config file")
    run.add_argument("config", help="path of the job's TOML config")
    run.add_argument(
        "--available-now",
        action="store_true",
        help="process what is in Kafka now (and due), then exit 0",
    )
    run.add_argument(
        "--master", help="Spark master when not launched by spark-submit, e.g. local[2]"
    )
    check = commands.add_parser("check", help="validate a config without starting Spark")
    check.add_argument("config", help="path of the job's TOML config")
    demo = commands.add_parser("demo", help="run the embedded end-to-end demo")
    demo.add_argument("--records", type=int, default=200, help="sample orders to produce")
    demo.add_argument("--workdir", default=".retrylib/demo", help="where tables and state go")
    return parser


def _run(args: argparse.Namespace) -> int:
    from retrylib.config import load_config
    from retrylib.job import run

    return run(load_config(args.config), available_now=args.available_now, master=args.master)


def _check(args: argparse.Namespace) -> int:
    from retrylib.config import collect_config_errors

    problems = collect_config_errors(args.config)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if problems:
        return EXIT_CONFIG
    print(f"{args.config}: ok")
    return EXIT_OK


def _demo(args: argparse.Namespace) -> int:
    from retrylib.demo import run_demo

    return run_demo(records=args.records, workdir=args.workdir)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `retrylib` console script; returns the exit code.

    Exit codes: 0 success, 1 the job or a command failed, 2 the config is invalid.
    """
    args = _parser().parse_args(argv)
    configure_logging()
    commands = {"run": _run, "check": _check, "demo": _demo}
    try:
        return commands[args.command](args)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return EXIT_CONFIG
    except RetrylibError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
