"""retrylib's own files in the job's checkpoint, on whatever file system Spark writes it to.

A location with a URI scheme (`s3a://`, `abfss://`, `gs://`, `hdfs://`, `dbfs:/`, `file:/`)
goes through Hadoop's FileSystem in Spark's JVM, the API Spark writes its own checkpoint
with: the cluster's credentials apply and no Python process needs any. A plain local path
is handled in Python, where a hard link gives `claim_json` an atomic create-if-absent.
Only the driver calls these (they need the session's JVM).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:")


def join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *parts])


def _is_local(uri: str) -> bool:
    return not _SCHEME.match(uri)


def _hadoop(spark: SparkSession, uri: str) -> tuple[Any, Any]:
    """The Hadoop FileSystem holding `uri`, and `uri` as a Hadoop Path."""
    jvm = spark.sparkContext._jvm
    path = jvm.org.apache.hadoop.fs.Path(uri)
    return path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()), path


def _java_error(error: Exception, class_name: str) -> bool:
    java = getattr(error, "java_exception", None)
    return java is not None and java.getClass().getName() == class_name


def read_json(spark: SparkSession, uri: str) -> Any | None:
    """The JSON content of `uri`, or None when the file does not exist."""
    text = read_text(spark, uri)
    return None if text is None else json.loads(text)


def read_text(spark: SparkSession, uri: str) -> str | None:
    """The UTF-8 text of `uri`, or None when the file does not exist."""
    if _is_local(uri):
        try:
            with open(uri, encoding="utf-8") as stream:
                return stream.read()
        except FileNotFoundError:
            return None
    fs, path = _hadoop(spark, uri)
    if not fs.exists(path):
        return None
    stream = fs.open(path)
    try:
        data = spark.sparkContext._jvm.org.apache.commons.io.IOUtils.toByteArray(stream)
    finally:
        stream.close()
    return bytes(data).decode("utf-8")


def claim_json(spark: SparkSession, uri: str, content: dict[str, Any]) -> dict[str, Any]:
    """Write `content` at `uri` unless a file is there already; return what is in place.

    The caller compares the result with `content` by identity to learn whether it won. On a
    local path the file is written and synced beside, then hard-linked into place, which
    fails when the name exists: the first writer wins, readers never see a partial file,
    and the decision survives a machine crash. Elsewhere Hadoop's create-if-absent does it
    (atomic on HDFS; on object stores a single PUT, where the job relies on Kafka's fencing
    of a second instance instead).
    """
    data = json.dumps(content).encode()
    if not _is_local(uri):
        fs, path = _hadoop(spark, uri)
        try:
            out = fs.create(path, False)
        except Exception as error:
            if not _java_error(error, "org.apache.hadoop.fs.FileAlreadyExistsException"):
                raise
            existing = read_json(spark, uri)
            if existing is None:  # pragma: no cover - removed between create and read
                raise
            return existing
        try:
            out.write(bytearray(data))
        finally:
            out.close()
        return content
    temporary = _synced_beside(uri, data)
    try:
        os.link(temporary, uri)
    except FileExistsError:
        existing = read_json(spark, uri)
        if existing is None:  # pragma: no cover - removed between link and read
            raise
        return existing
    finally:
        os.unlink(temporary)
    directory = os.open(os.path.dirname(uri) or ".", os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    return content


def replace_json(spark: SparkSession, uri: str, content: dict[str, Any]) -> None:
    """Write `content` at `uri`, replacing what is there.

    On a local path the file is written beside and renamed into place, so a reader sees the
    old content or the new, never a part. Elsewhere Hadoop's create with overwrite writes it
    (a single PUT on object stores; on HDFS a crash while writing can leave the file short,
    so callers must treat unreadable content as absent).
    """
    data = json.dumps(content).encode()
    if not _is_local(uri):
        fs, path = _hadoop(spark, uri)
        out = fs.create(path, True)
        try:
            out.write(bytearray(data))
        finally:
            out.close()
        return
    os.replace(_synced_beside(uri, data), uri)


def _synced_beside(uri: str, data: bytes) -> str:
    """Write `data` to a temporary file next to the local path `uri`, synced; its path."""
    os.makedirs(os.path.dirname(uri) or ".", exist_ok=True)
    temporary = f"{uri}.tmp-{os.getpid()}"
    with open(temporary, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    return temporary


def delete_tree(spark: SparkSession, uri: str) -> None:
    """Delete a file, or a directory and all below it; a missing one is fine."""
    if _is_local(uri):
        if os.path.isdir(uri):
            shutil.rmtree(uri, ignore_errors=True)
        elif os.path.exists(uri):
            os.unlink(uri)
        return
    fs, path = _hadoop(spark, uri)
    fs.delete(path, True)


def list_names(spark: SparkSession, uri: str) -> list[str]:
    """Names of the entries directly in directory `uri` (empty when it does not exist)."""
    if _is_local(uri):
        try:
            return os.listdir(uri)
        except (FileNotFoundError, NotADirectoryError):
            return []
    fs, path = _hadoop(spark, uri)
    if not fs.exists(path):
        return []
    return [status.getPath().getName() for status in fs.listStatus(path)]
