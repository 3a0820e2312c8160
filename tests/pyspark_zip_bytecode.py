"""Bytecode in the installed pyspark's `python/lib/pyspark.zip`, made once per virtualenv by
`setup.sh` (`python tests/pyspark_zip_bytecode.py`).

Every Python process Spark starts (a job's driver under spark-submit, the streaming source's
runner, each data-source planning worker and each executor's worker daemon) has that zip
first on its path, so it imports pyspark from the zip. Python keeps no bytecode cache for a
zip: each such process compiles the pyspark modules it imports from source. Measured here on
an idle machine: importing `python_streaming_source_runner` took 2.0 CPU-s from the zip as
pip installs it and 0.9 s with bytecode beside the sources; `pyspark.worker` 1.7 s against
0.6 s. A job starts five or six such processes; the tests start some 170 jobs.

And the streaming source's runner must connect back to the driver's JVM within 10 s
(Spark's `PythonWorkerFactory`, not configurable): on two loaded cores its start from
source once took longer, and the query failed with "Python worker failed to connect back".

Each module's `.pyc` goes beside its `.py` in the zip (the layout zipimport looks for), as an
unchecked-hash pyc, since zipimport would otherwise compare it with the source's time in the
zip; its code names the source's path inside the zip, as compiling from the zip would, so
tracebacks read the same. Only the interpreter that made it (its magic number) uses it;
another Python finds a bad magic and compiles from the source as before.
"""

from __future__ import annotations

import importlib.util
import os
import py_compile
import sys
import tempfile
import zipfile
from pathlib import Path

import pyspark


def spark_python_zip() -> Path:
    """The zip Spark puts first on its Python processes' path: `$SPARK_HOME/python/lib`,
    where SPARK_HOME is the pip-installed pyspark's folder."""
    return Path(pyspark.__file__).parent / "python" / "lib" / "pyspark.zip"


def has_bytecode(archive: Path) -> bool:
    """Whether `archive` holds this interpreter's bytecode for pyspark's `__init__`."""
    with zipfile.ZipFile(archive) as z:
        try:
            head = z.read("pyspark/__init__.pyc")[:4]
        except KeyError:
            return False
    return head == importlib.util.MAGIC_NUMBER


def add_bytecode(archive: Path) -> int:
    """Rewrite `archive` with a `.pyc` beside each `.py` (the zip is replaced whole, so a
    reader never sees half of it); returns how many it compiled."""
    compiled = 0
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        rewritten = archive.with_name(f".{archive.name}.rewriting")
        with (
            zipfile.ZipFile(archive) as source,
            zipfile.ZipFile(rewritten, "w", zipfile.ZIP_DEFLATED) as target,
        ):
            for entry in source.infolist():
                data = source.read(entry)
                target.writestr(entry, data)
                if not entry.filename.endswith(".py"):
                    continue
                module = folder / entry.filename
                module.parent.mkdir(parents=True, exist_ok=True)
                module.write_bytes(data)
                pyc = module.with_suffix(".pyc")
                py_compile.compile(
                    str(module),
                    cfile=str(pyc),
                    dfile=os.path.join(archive, entry.filename),
                    doraise=True,
                    invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
                )
                target.write(pyc, entry.filename[: -len(".py")] + ".pyc")
                compiled += 1
        os.replace(rewritten, archive)
    return compiled


def main() -> int:
    archive = spark_python_zip()
    if has_bytecode(archive):
        print(f"{archive}: has bytecode already")
        return 0
    print(f"{archive}: compiled {add_bytecode(archive)} modules into it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
