"""The Spark a driver must run: 4.0 or newer (Python data sources, Spark Connect's streaming
API and Delta 4 all begin there). `retrylib.ops.cli` asks before a command that uses Spark
imports any of it, so an older Spark, such as EMR 7's 3.5, is refused in one line naming the
version needed instead of failing in a traceback at the first name Spark 4 added.
"""

from __future__ import annotations

import re

OLDEST_SPARK = (4, 0)
_MAJOR_MINOR = re.compile(r"(\d+)\.(\d+)")


def spark_version_problem(version: str | None) -> str | None:
    """Why the driver's pyspark at `version` (None: not importable) cannot run retrylib, in
    one line, or None when it can. A version that does not start with <major>.<minor> (a
    vendor's build) is let through: Spark itself then says what is missing."""
    needed = "Spark {}.{} or newer".format(*OLDEST_SPARK)
    if version is None:
        return (
            f"no pyspark is importable here, and this command needs {needed}: run it with "
            "a cluster's spark-submit, or install retrylib's spark extra (retrylib[spark])"
        )
    found = _MAJOR_MINOR.match(version)
    if found is None or (int(found[1]), int(found[2])) >= OLDEST_SPARK:
        return None
    return (
        f"retrylib needs {needed}; this driver's pyspark is {version} "
        "(on EMR, a release with Spark 4: emr-spark-8.0.0 or newer)"
    )


def driver_pyspark_version() -> str | None:
    """pyspark's version where this process imports it (a cluster's Spark puts its own on
    the path), or None when there is none."""
    try:
        import pyspark
    except ImportError:
        return None
    return str(getattr(pyspark, "__version__", ""))
