"""The driver's Spark jobs in two scheduler pools: a batch's own jobs first, and what the job
computes beside its batches (a table's state for the next append, the dead letters waiting)
with the cores the batch leaves.

Spark's default FIFO scheduler gives a freed core to the job submitted first, so a batch's
produce job waited behind the tasks of a table's state started at its routing (a run's first
batch, local[2]: its produce 3.2 s, median of five, with the pools, against 4.4 s without). A
session retrylib builds runs the FAIR scheduler with an allocation file of its own: the
default pool, where every job goes unless told otherwise, has weight 10 and a minimum share
of 2 tasks, so its tasks take a freed core first; `BACKGROUND_POOL` has weight 1. A session
built by others (a notebook's, Databricks') keeps its scheduler: under FIFO the pool is
ignored, under FAIR it is made with Spark's defaults.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

BACKGROUND_POOL = "retrylib-background"
ALLOCATIONS = f"""<?xml version="1.0"?>
<allocations>
  <pool name="default">
    <schedulingMode>FIFO</schedulingMode>
    <weight>10</weight>
    <minShare>2</minShare>
  </pool>
  <pool name="{BACKGROUND_POOL}">
    <schedulingMode>FIFO</schedulingMode>
    <weight>1</weight>
    <minShare>0</minShare>
  </pool>
</allocations>
"""


def pool_settings(folder: str | None = None) -> dict[str, str]:
    """The session settings of the two pools: the FAIR scheduler and `ALLOCATIONS`, written
    once to `folder` (the temporary folder by default) under a name of its content, which
    the driver reads, by its file: URI, as its SparkContext starts."""
    digest = hashlib.sha256(ALLOCATIONS.encode()).hexdigest()[:12]
    path = Path(folder or tempfile.gettempdir()) / f"retrylib-pools-{digest}.xml"
    if not path.exists():
        # Written aside and renamed into place: two jobs starting at once on one host.
        written = path.with_name(f"{path.name}.{os.getpid()}")
        written.write_text(ALLOCATIONS)
        os.replace(written, path)
    # A file: URI: Spark opens a plain path on the default file system, which on EMR is HDFS.
    return {"spark.scheduler.mode": "FAIR", "spark.scheduler.allocation.file": path.as_uri()}
