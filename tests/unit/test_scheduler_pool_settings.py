"""The scheduler pools a session retrylib builds runs its jobs in (`spark.scheduler.mode`
FAIR and an allocation file of its own, `retrylib.spark.scheduling`)."""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree
from pathlib import Path
from urllib.parse import urlparse

from retrylib.spark.scheduling import BACKGROUND_POOL, pool_settings


def test_the_batches_pool_takes_freed_cores_before_the_background_pool(tmp_path) -> None:
    settings = pool_settings(str(tmp_path))

    assert settings["spark.scheduler.mode"] == "FAIR"
    # A file: URI: a plain path would be opened on the default file system (HDFS on EMR).
    uri = urlparse(settings["spark.scheduler.allocation.file"])
    assert uri.scheme == "file"
    pools = {
        pool.get("name"): (int(pool.findtext("weight")), int(pool.findtext("minShare")))
        for pool in ElementTree.parse(uri.path).getroot()
    }
    # Spark's jobs go to "default" unless a thread names a pool: the batches' jobs.
    assert pools == {"default": (10, 2), BACKGROUND_POOL: (1, 0)}


def test_the_allocation_file_is_written_once_and_named_by_its_content(tmp_path) -> None:
    first = pool_settings(str(tmp_path))["spark.scheduler.allocation.file"]
    again = pool_settings(str(tmp_path))["spark.scheduler.allocation.file"]

    assert first == again and list(tmp_path.iterdir()) == [Path(urlparse(first).path)]
