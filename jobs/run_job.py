"""spark-submit entry point: `spark-submit jobs/run_job.py CONF [--available-now]`."""

import sys

from retrylib.ops.cli import main

if __name__ == "__main__":
    sys.exit(main(["run", *sys.argv[1:]]))
