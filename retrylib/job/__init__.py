"""A job's streaming query: `run` runs it until done or told to stop; `start_query` starts it
and `stop_gracefully` stops it, for a script that watches it itself.

- `kinds`: which kind of job a config runs, `handler_job` or `router_job`, each owning what
  differs (topics, task plan, batch commit, what `status` and `check` show).
- `start`: topics and runner lease, then the checkpoint, tables and query;
  `source_frame` the sources it reads, `batch_commit` its foreachBatch function.
- `run_loop`: the run until done; `stopping`: the graceful stop.
"""

from __future__ import annotations

from retrylib.job.run_loop import run
from retrylib.job.start import start_query
from retrylib.job.stopping import stop_gracefully

__all__ = ["run", "start_query", "stop_gracefully"]
