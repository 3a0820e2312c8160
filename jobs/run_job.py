"""spark-submit entry point: `spark-submit jobs/run_job.py CONF [--available-now]` runs the
job; `spark-submit jobs/run_job.py status|redrive CONF [OPTIONS]` runs that `retrylib`
command in the session spark-submit starts, which reads the job's tables where the cluster
keeps them (an EMR step: deploy/emr/submit.sh)."""

import sys
from collections.abc import Sequence

from retrylib.ops.cli import main

TOOLS = ("status", "redrive")


def command_line(arguments: Sequence[str]) -> list[str]:
    """The `retrylib` command line of this script's `arguments`: `run` unless they name a tool."""
    if arguments and arguments[0] in TOOLS:
        return list(arguments)
    return ["run", *arguments]


if __name__ == "__main__":
    sys.exit(main(command_line(sys.argv[1:])))
