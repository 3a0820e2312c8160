"""spark-submit entry point: `spark-submit jobs/run_job.py CONF [--available-now]` runs the
job; `spark-submit jobs/run_job.py status|redrive CONF [OPTIONS]` runs that `retrylib`
command in the session spark-submit starts, which reads the job's tables where the cluster
keeps them (an EMR step: deploy/emr/submit.sh)."""

import sys

from retrylib.ops.cli import script_main

if __name__ == "__main__":
    sys.exit(script_main(sys.argv[1:]))
