"""Shipping the user's code (the handler, record hooks, a token provider) to the executors
of a cluster.

Locally the executors share the driver's disk, so `handler.paths` is enough. On a cluster
they do not: each top-level package (or module) is zipped and added with
`SparkContext.addPyFile`, which puts it on every executor's `sys.path` (a Spark Connect
client uploads it to its server as an artifact of the session).
"""

from __future__ import annotations

import importlib.util
import logging
import sys
import tempfile
import zipfile
from pathlib import Path

from pyspark.sql import SparkSession

from retrylib.config.model import RECORD_HOOKS, AnyConfig, Config
from retrylib.errors import ConfigError
from retrylib.spark.flavour import flavour_of

log = logging.getLogger(__name__)


def code_source(reference: str, paths: tuple[str, ...], key: str) -> Path:
    """The file or package directory holding the top-level module of `reference`
    ("module:function"), found with `paths` on sys.path.

    Raises `ConfigError` naming `key` when the module cannot be found.
    """
    for path in reversed(paths):
        if path not in sys.path:
            sys.path.insert(0, path)
    top = reference.partition(":")[0].split(".")[0]
    spec = importlib.util.find_spec(top)
    if spec is None or spec.origin is None:
        raise ConfigError(f"{key}: module {top!r} not found on {list(paths)}")
    origin = Path(spec.origin)
    return origin.parent if origin.name == "__init__.py" else origin


def ship_code(spark: SparkSession, config: AnyConfig) -> None:
    """Add the top-level package or module of a handler job's handler and record hooks, and
    of the OAUTHBEARER token provider, if any, to every executor's Python path.

    Packages that come from site-packages (installed as a wheel on the cluster) are left
    alone.
    """
    references = {}
    paths = config.kafka.import_paths
    if isinstance(config, Config):
        references["handler.function"] = config.handler.function
        paths = config.handler.paths
        references.update(
            (f"hooks.{name}", reference)
            for name, reference in config.hooks.references(RECORD_HOOKS).items()
        )
    security = config.kafka.security
    if security is not None and security.token_provider is not None:
        references["kafka.security.token_provider"] = security.token_provider
    sources = {code_source(ref, paths, key) for key, ref in references.items()}
    for source in sorted(sources):
        _ship(spark, source)


def _ship(spark: SparkSession, source: Path) -> None:
    if "site-packages" in source.parts:
        return
    add_py_file = flavour_of(spark).add_py_file
    if source.is_file():
        add_py_file(spark, source)
    else:
        bundle = Path(tempfile.mkdtemp(prefix="retrylib-code-")) / f"{source.name}.zip"
        with zipfile.ZipFile(bundle, "w") as archive:
            for path in sorted(source.rglob("*.py")):
                archive.write(path, path.relative_to(source.parent))
        add_py_file(spark, bundle)
    log.info("shipped %s to the executors", source)
