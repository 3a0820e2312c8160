"""Reading and writing the job's own state files, each whole or absent after a crash, on the
file system Spark keeps the job's state on.

Where a location is:

- A URI (`hdfs://`, `s3://`, `s3a://`, `abfss://`, `gs://`, `dbfs:/`, `file:/`) goes through
  Hadoop's FileSystem in Spark's JVM, the API Spark writes its own checkpoint with: the
  cluster's credentials apply and no Python process needs any.
- A plain path means what it means to Spark: it is resolved against the cluster's default
  file system (`fs.defaultFS`), so on a cluster whose default is HDFS it is an HDFS path,
  through Hadoop too. Only where the default file system is the local disk, and through
  Spark Connect (whose client has no JVM, and shares the path with the server, as
  /Volumes/... on Databricks), is a plain path a file on this machine's disk, handled in
  Python.

How a write stays whole or absent, by family (`docs/exactly-once.md` has the table):

- The driver's disk: written and synced beside the final name, then renamed into place
  (`replace_json`) or hard-linked there (`claim_json`: a link refuses an existing name).
- File systems whose rename is atomic (HDFS, the local disk through Hadoop, ADLS Gen2's
  `abfs(s)`): written beside the final name and renamed into place with Hadoop's
  FileContext, which overwrites (`replace_json`) or refuses an existing name
  (`claim_json`). HDFS shows a file from its create on, so nothing is ever written under
  the final name itself.
- Object stores (S3 through EMRFS or S3A, Google Cloud Storage, Azure Blob's `wasb(s)`,
  DBFS, ...): rename is a copy, but an object appears whole when its writer closes it, so
  the file is written under its final name directly; a crash before the close leaves
  nothing. `claim_json` creates it only if absent: conditionally where the connector offers
  it (S3A from Hadoop 3.5, pyspark 4.1's and 4.2's: If-None-Match on the upload, so of two
  writers racing, the second one's close is refused), else by Hadoop's plain
  create-if-absent, which only looks before it writes (S3A of Hadoop 3.4, EMRFS): there the
  job's runner lease keeps a second writer away.

Only the driver calls these (they need the session's JVM).
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from typing import TYPE_CHECKING, Any

from retrylib.config.locations import location_id
from retrylib.config.table_ref import is_uri
from retrylib.errors import DamagedFile, RetrylibError
from retrylib.spark.flavour import flavour_of

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

TEMPORARY_MARK = ".tmp-"
"""What the name of a file written beside its final name adds to that name; a crash can leave
one behind (`Checkpoint.clean_up` removes the batch files' ones)."""

_WHOLE_ON_CLOSE = frozenset(
    {"s3", "s3a", "s3n", "gs", "wasb", "wasbs", "dbfs", "oss", "cos", "cosn", "obs"}
)
"""Schemes of object stores: rename is a copy there, and an object appears whole on close."""
_ALREADY_EXISTS = "org.apache.hadoop.fs.FileAlreadyExistsException"
_CONDITIONAL_CREATE = "fs.option.create.conditional.overwrite"
"""Hadoop's create option for a create the store refuses at close when the name was taken
meanwhile; a file system that has it says so as a path capability of the same name."""
_TAKEN_MEANWHILE = "org.apache.hadoop.fs.s3a.RemoteFileChangedException"
"""What S3A's conditional create raises at close when the object appeared meanwhile (412)."""
_UNSUPPORTED = "org.apache.hadoop.fs.UnsupportedFileSystemException"


def join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *parts])


def on_driver_disk(spark: SparkSession | None, uri: str) -> bool:
    """Whether `uri` is a file on this machine's disk, handled in Python: a plain path where
    Spark's default file system is the local one, through Spark Connect, or with no session
    (`spark` None: code that reads local files without Spark, as the unit tests do)."""
    if is_uri(uri):
        return False
    return spark is None or flavour_of(spark).paths_are_local(spark)


def _hadoop(spark: SparkSession | None, uri: str) -> tuple[Any, Any]:
    """The Hadoop FileSystem holding `uri`, and `uri` as a Hadoop Path.

    Raises `RetrylibError` for a Spark Connect session, which has no JVM on this side."""
    if spark is None:
        raise RetrylibError(f"{uri}: a URI needs a Spark session to be read or written")
    return flavour_of(spark).hadoop_file(spark, uri)


def qualified_location(spark: SparkSession, uri: str) -> str:
    """Where `uri` is, in the one spelling `location_id` gives each place: a plain path
    resolved against Spark's default file system (`/x` and `hdfs://nn:8020/x` are one folder
    where that is `hdfs://nn:8020`), the file system's own name for itself (a NameNode with its
    default port), a local file with its symlinks resolved."""
    if on_driver_disk(spark, uri):
        return location_id(uri)
    fs, path = _hadoop(spark, uri)
    canonical = fs.getCanonicalUri()
    qualified = fs.makeQualified(path).toUri()
    authority = canonical.getAuthority() or ""
    return location_id(f"{canonical.getScheme()}://{authority}{qualified.getPath()}")


def _java_error(error: Exception, class_name: str) -> bool:
    java = getattr(error, "java_exception", None)
    return java is not None and java.getClass().getName() == class_name


def read_json(spark: SparkSession | None, uri: str) -> Any | None:
    """The JSON content of `uri`, or None when the file does not exist.

    Raises `DamagedFile` naming `uri` when it holds no JSON (cut short, a bad copy)."""
    text = read_text(spark, uri)
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as error:
        raise DamagedFile(uri, f"not JSON: {error}") from error


def read_text(spark: SparkSession | None, uri: str) -> str | None:
    """The UTF-8 text of `uri`, or None when the file does not exist."""
    if on_driver_disk(spark, uri):
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


def claim_json(spark: SparkSession | None, uri: str, content: dict[str, Any]) -> dict[str, Any]:
    """Write `content` at `uri` unless a file is there already; return what is in place.

    The caller compares the result with `content` by identity to learn whether it won: the
    first writer wins, and readers never see a part of a file (see the module docstring for
    how, on each file system). On the driver's disk the decision also survives a machine
    crash (file and folder synced).
    """
    data = json.dumps(content).encode()
    if on_driver_disk(spark, uri):
        won = _link_local(uri, data)
    else:
        won = _write_hadoop(spark, uri, data, replace=False)
    if won:
        return content
    existing = read_json(spark, uri)
    if existing is None:  # pragma: no cover - removed between the refusal and the read
        raise RetrylibError(f"{uri} was removed while it was being claimed; start again")
    return existing


def replace_json(spark: SparkSession | None, uri: str, content: dict[str, Any]) -> None:
    """Write `content` at `uri`, replacing what is there: a reader, and the next start after
    a crash, sees the old content or the new, never a part (module docstring)."""
    data = json.dumps(content).encode()
    if on_driver_disk(spark, uri):
        os.replace(_synced_beside(uri, data), uri)
    else:
        _write_hadoop(spark, uri, data, replace=True)


def _link_local(uri: str, data: bytes) -> bool:
    """Put `data` at the local path `uri` unless a file is there; whether it was put."""
    temporary = _synced_beside(uri, data)
    try:
        os.link(temporary, uri)
    except FileExistsError:
        return False
    finally:
        os.unlink(temporary)
    directory = os.open(os.path.dirname(uri) or ".", os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    return True


def _synced_beside(uri: str, data: bytes) -> str:
    """Write `data` to a temporary file next to the local path `uri`, synced; its path."""
    os.makedirs(os.path.dirname(uri) or ".", exist_ok=True)
    temporary = f"{uri}{TEMPORARY_MARK}{os.getpid()}"
    with open(temporary, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    return temporary


def _write_hadoop(spark: SparkSession, uri: str, data: bytes, *, replace: bool) -> bool:
    """Put `data` at `uri` through Hadoop, replacing a file there when `replace`, else only
    where there is none; whether it was put."""
    fs, path = _hadoop(spark, uri)
    scheme = fs.makeQualified(path).toUri().getScheme()
    context = None if scheme in _WHOLE_ON_CLOSE else _file_context(spark, fs, path)
    if context is None:  # whole on close: the final name directly
        try:
            _write_file(fs, path, data, overwrite=replace, conditional=not replace)
        except Exception as error:
            taken = _java_error(error, _ALREADY_EXISTS) or _java_error(error, _TAKEN_MEANWHILE)
            if replace or not taken:
                raise
            return False
        return True
    jvm = spark.sparkContext._jvm
    temporary = jvm.org.apache.hadoop.fs.Path(f"{uri}{TEMPORARY_MARK}{uuid.uuid4().hex[:12]}")
    _write_file(fs, temporary, data, overwrite=False)
    rename = getattr(jvm.org.apache.hadoop.fs, "Options$Rename")
    options = spark.sparkContext._gateway.new_array(rename, 1)
    options[0] = rename.OVERWRITE if replace else rename.NONE
    try:
        context.rename(fs.makeQualified(temporary), fs.makeQualified(path), options)
    except Exception as error:
        fs.delete(temporary, False)
        if replace or not _java_error(error, _ALREADY_EXISTS):
            raise
        return False
    return True


def _file_context(spark: SparkSession, fs: Any, path: Any) -> Any | None:
    """Hadoop's FileContext for `path`'s file system, whose rename can overwrite or refuse
    atomically; None where Hadoop has none for it (then the file system is taken to show a
    file whole on close, as Spark's own checkpoint writer does)."""
    try:
        return spark.sparkContext._jvm.org.apache.hadoop.fs.FileContext.getFileContext(
            fs.makeQualified(path).toUri(), spark.sparkContext._jsc.hadoopConfiguration()
        )
    except Exception as error:
        if _java_error(error, _UNSUPPORTED):
            return None
        raise


def _write_file(
    fs: Any, path: Any, data: bytes, *, overwrite: bool, conditional: bool = False
) -> None:
    """Write `data` at `path`; with `conditional`, refused at close where the file system
    can refuse a name taken since the create (`_CONDITIONAL_CREATE`)."""
    if conditional and fs.hasPathCapability(path, _CONDITIONAL_CREATE):
        out = fs.createFile(path).overwrite(False).must(_CONDITIONAL_CREATE, True).build()
    else:
        out = fs.create(path, overwrite)
    try:
        out.write(bytearray(data))
    finally:
        out.close()


def delete_tree(spark: SparkSession | None, uri: str) -> None:
    """Delete a file, or a directory and all below it; a missing one is fine."""
    if on_driver_disk(spark, uri):
        if os.path.isdir(uri):
            shutil.rmtree(uri, ignore_errors=True)
        elif os.path.exists(uri):
            os.unlink(uri)
        return
    fs, path = _hadoop(spark, uri)
    fs.delete(path, True)


def list_names(spark: SparkSession | None, uri: str) -> list[str]:
    """Names of the entries directly in directory `uri` (empty when it does not exist)."""
    if on_driver_disk(spark, uri):
        try:
            return os.listdir(uri)
        except (FileNotFoundError, NotADirectoryError):
            return []
    fs, path = _hadoop(spark, uri)
    if not fs.exists(path):
        return []
    return [status.getPath().getName() for status in fs.listStatus(path)]
