"""Databricks entry point: `run_job.py CONF [--available-now]` runs `retrylib run`.

`sys.exit` carries the exit code to the task (0 done or stopped, 1 failed, 2 bad config).
"""

import sys

from retrylib.ops.cli import main

if __name__ == "__main__":
    sys.exit(main(["run", *sys.argv[1:]]))
