"""Log setup: retrylib's own lines at INFO, Spark, py4j and Kafka client noise quiet."""

from __future__ import annotations

import logging
import os

_QUIET = ("py4j", "pyspark", "urllib3", "deltalake")


def configure_logging(level: str | None = None) -> None:
    """Log to stderr as `time level logger: message`; RETRYLIB_LOG_LEVEL overrides `level`."""
    chosen = (os.environ.get("RETRYLIB_LOG_LEVEL") or level or "INFO").upper()
    logging.basicConfig(
        level=logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        force=True,
    )
    logging.getLogger("retrylib").setLevel(chosen)
    for name in _QUIET:
        logging.getLogger(name).setLevel(logging.WARNING)
