"""Shipping the handler's code to the executors of a cluster.

Locally the executors share the driver's disk, so `handler.paths` is enough. On a cluster
they do not: the handler's top-level package (or module) is zipped and added with
`SparkContext.addPyFile`, which puts it on every executor's `sys.path`.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
import tempfile
import zipfile
from pathlib import Path

from pyspark.sql import SparkSession

from retrylib.config.model import HandlerConfig
from retrylib.errors import ConfigError

log = logging.getLogger(__name__)


def handler_source(handler: HandlerConfig) -> Path:
    """The file or package directory holding the handler's top-level module.

    Raises `ConfigError` naming `handler.function` when the module cannot be found.
    """
    for path in reversed(handler.paths):
        if path not in sys.path:
            sys.path.insert(0, path)
    top = handler.function.partition(":")[0].split(".")[0]
    spec = importlib.util.find_spec(top)
    if spec is None or spec.origin is None:
        raise ConfigError(f"handler.function: module {top!r} not found on {list(handler.paths)}")
    origin = Path(spec.origin)
    return origin.parent if origin.name == "__init__.py" else origin


def ship_handler(spark: SparkSession, handler: HandlerConfig) -> None:
    """Add the handler's top-level package or module to every executor's Python path.

    Packages that come from site-packages (installed as a wheel on the cluster) are left
    alone.
    """
    source = handler_source(handler)
    if "site-packages" in source.parts:
        return
    if source.is_file():
        spark.sparkContext.addPyFile(str(source))
    else:
        bundle = Path(tempfile.mkdtemp(prefix="retrylib-handler-")) / f"{source.name}.zip"
        with zipfile.ZipFile(bundle, "w") as archive:
            for path in sorted(source.rglob("*.py")):
                archive.write(path, path.relative_to(source.parent))
        spark.sparkContext.addPyFile(str(bundle))
    log.info("shipped handler code %s to the executors", source)
