"""The job's checkpoint: what lives where in it, and reading and writing its files.

`Checkpoint(root)` is the one owner of the layout under the configured `job.checkpoint`:

    <root>/spark/                      Spark's own checkpoint of the query
        offsets/<N>, commits/<N>       read here for `status` and the metrics
    <root>/retrylib/identity.json      the checkpoint's app id ("<job>-<random>")
    <root>/retrylib/signing_key.json   the key that signs the job's Kafka records
    <root>/retrylib/main_reader.json   the reader of the main topics it was started with
    <root>/retrylib/manifests/<N>.json batch N's clock, counters and counts of its decisions
    <root>/retrylib/staged/<N>/        batch N's staging folder: its decisions (Parquet), kept
                                       until batch N+1 ran
    <root>/retrylib/compaction.json    when the tables were last compacted
    <root>/retrylib/breaker.json       the breaker's last change of state
    <root>/retrylib/key_order/<N>.json the keys waiting behind retries after batch N
                                       (`retry.key_ordered`; the last two changes kept)

Files go to the file system Spark keeps its own checkpoint on, each whole or absent after a
crash (`retrylib.state.files`). Only the driver calls these (they need the session's JVM).
"""

from __future__ import annotations

import json
import re
import secrets
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from retrylib.errors import DamagedFile, RetrylibError
from retrylib.kafka.offsets import PartitionKey
from retrylib.source.main_reader import READERS, main_reader
from retrylib.state.files import (
    TEMPORARY_MARK,
    claim_json,
    delete_tree,
    join,
    list_names,
    qualified_location,
    read_json,
    read_text,
    replace_json,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

STAGING_FOLDER = "staged"
"""The folder of the batches' staging folders. A replayed batch reads its own back, possibly
in a newer version of retrylib: the name stays "staged"."""
_SPARK_TEMPORARY = re.compile(r"\.?\.[0-9]+\.[0-9a-f-]+\.tmp(\.crc)?")
"""A Spark log file being written (`.<N>.<uuid>.tmp`), and its checksum (`..<N>.<uuid>.tmp.crc`)."""
MANIFESTS_KEPT = 20
KEY_ORDER_KEPT = 2  # the newest, and the one before it should the newest be unreadable


@dataclass(frozen=True)
class Checkpoint:
    """The checkpoint at `root` (the config's `job.checkpoint`); see the module docstring."""

    root: str

    def place(self, spark: SparkSession) -> str:
        """Where the checkpoint is, one spelling per place (`qualified_location`): what the
        job's runner lease is keyed on."""
        return qualified_location(spark, self.root)

    @property
    def spark(self) -> str:
        """Spark's checkpoint of the query (its `checkpointLocation`)."""
        return join(self.root, "spark")

    @property
    def state(self) -> str:
        """retrylib's own folder."""
        return join(self.root, "retrylib")

    @property
    def manifests(self) -> str:
        return join(self.state, "manifests")

    def manifest(self, batch_id: int) -> str:
        return join(self.manifests, f"{batch_id}.json")

    def staging(self, batch_id: int) -> str:
        return join(self.state, STAGING_FOLDER, str(batch_id))

    @property
    def compaction(self) -> str:
        return join(self.state, "compaction.json")

    @property
    def breaker(self) -> str:
        """The breaker's last change of state (`retrylib.retry.breaker`), for `status`."""
        return join(self.state, "breaker.json")

    @property
    def key_order(self) -> str:
        """The folder of the key queues, a file per batch that changed them
        (`retrylib.batch.key_order_store`)."""
        return join(self.state, "key_order")

    def app_id(self, spark: SparkSession, job_name: str) -> str:
        """The Delta app id and produce-marker id of this checkpoint: "<job>-<random>".

        Created with the checkpoint and kept in it. Batch ids restart at 0 when a checkpoint
        is deleted; a fresh id keeps the new run's batches from being mistaken for replays of
        the old run's (which would skip their commits and lose their records).
        """
        uri = join(self.state, "identity.json")
        identity = read_json(spark, uri)
        if identity is None:  # two instances starting at once agree on the first one's id
            identity = claim_json(spark, uri, {"app_id": f"{job_name}-{uuid.uuid4().hex[:12]}"})
        return identity["app_id"]

    def signing_key(self, spark: SparkSession) -> bytes:
        """The key that signs the job's retry and dead-letter records (`headers.sign`).

        Created at random with the checkpoint and kept in it, so only this job can write
        records its tasks accept as retries. A new checkpoint makes a new key: retry records
        still waiting from before then go to the dead letter as `unverified_retry_record`
        (redrive brings them back).
        """
        uri = join(self.state, "signing_key.json")
        stored = read_json(spark, uri)
        if stored is None:  # two instances starting at once agree on the first one's key
            stored = claim_json(spark, uri, {"key": secrets.token_hex(32)})
        return bytes.fromhex(stored["key"])

    def main_reader(
        self, spark: SparkSession, configured: str, connector_on_classpath: Callable[[], bool]
    ) -> str:
        """The reader of the main topics for `kafka.source = configured`
        (`retrylib.source.main_reader`), recorded here for the next start."""
        uri = join(self.state, "main_reader.json")
        try:
            stored = read_json(spark, uri)
            recorded = None if stored is None else _reader_in(stored, uri)
        except DamagedFile as error:
            raise RetrylibError(
                f"{uri} is damaged ({error.reason}): remove it and set kafka.source to the "
                'reader this checkpoint was started with ("python" or "builtin"), or start '
                "the job from a new checkpoint (job.checkpoint)"
            ) from error
        resumed = self._last_in_spark_log(spark, "offsets") is not None
        reader = main_reader(configured, recorded, resumed, connector_on_classpath, uri)
        if reader != recorded:
            replace_json(spark, uri, {"source": reader})
        return reader

    def manifest_ids(self, spark: SparkSession) -> list[int]:
        """The batch ids that have a manifest, in order."""
        names = list_names(spark, self.manifests)
        return sorted(int(name[:-5]) for name in names if name[:-5].isdigit())

    def clean_up(self, spark: SparkSession, batch_id: int) -> None:
        """Delete the batch state `expired_state` names, so that it stays a few files."""
        for folder in (STAGING_FOLDER, "manifests", "key_order"):
            names = list_names(spark, join(self.state, folder))
            for name in expired_state(folder, names, batch_id):
                delete_tree(spark, join(self.state, folder, name))

    def last_committed_batch(self, spark: SparkSession | None) -> int | None:
        """The id of the last batch Spark marked complete, or None."""
        return self._last_in_spark_log(spark, "commits")

    def check_offsets_log(self, spark: SparkSession | None) -> dict[PartitionKey, int]:
        """The end offsets of the latest batch Spark planned ({} before the first). Raises
        `RetrylibError` naming Spark's latest offsets file when it cannot be read, with the
        way out: Spark reads it first at a start, and would fail on its own parse error, with
        no word of the file."""
        last = self._last_in_spark_log(spark, "offsets")
        if last is None:
            return {}
        try:
            return self.batch_offsets(spark, last)[0]
        except DamagedFile as error:
            if last in self.manifest_ids(spark):
                fix = (
                    f"batch {last} was routed from it: restore the file from a backup, or start "
                    "the job from a new checkpoint (job.checkpoint)"
                )
            else:
                fix = (
                    f"batch {last} was not routed yet (it has no manifest): remove the file "
                    f"(and .{last}.crc beside it), and Spark plans the batch again"
                )
            raise RetrylibError(
                f"Spark's offsets file {error.uri} is damaged ({error.reason}): {fix}"
            ) from error

    def remove_unfinished_spark_log_files(self, spark: SparkSession | None) -> list[str]:
        """Remove what a process killed while Spark wrote its offsets or commits log left:
        the file under its temporary name (`.<N>.<uuid>.tmp`) and its checksum. Spark writes a
        log file under such a name and renames it once complete, so one is never state; but
        Spark 4.2 counts one in `offsets/` as a started batch 0 and refuses the query on every
        start. Call only while holding the job's lease. Returns the files removed."""
        removed = []
        for folder in ("offsets", "commits"):
            uri = join(self.spark, folder)
            for name in list_names(spark, uri):
                if _SPARK_TEMPORARY.fullmatch(name):
                    path = join(uri, name)
                    delete_tree(spark, path)
                    removed.append(path)
        return removed

    def _last_in_spark_log(self, spark: SparkSession | None, folder: str) -> int | None:
        """The highest batch id with a file in Spark's log `folder` ("offsets", "commits")."""
        names = list_names(spark, join(self.spark, folder))
        return max((int(name) for name in names if name.isdigit()), default=None)

    def batch_offsets(
        self, spark: SparkSession | None, batch_id: int
    ) -> tuple[dict[PartitionKey, int], int | None]:
        """End offsets of batch `batch_id` from Spark's offset log, every source merged (main
        and tier topics are distinct), and the batch's trigger time in epoch ms.

        Spark writes `offsets/<N>` before it runs batch N: a "v1" line, a metadata line, then
        one JSON line per source ({"topic": {"partition": offset}}). Raises
        `FileNotFoundError` when the file does not exist, `DamagedFile` when it is not such
        a file (cut short, a bad copy).
        """
        uri = join(self.spark, "offsets", str(batch_id))
        text = read_text(spark, uri)
        if text is None:
            raise FileNotFoundError(uri)
        lines = text.splitlines()
        if not lines or not re.fullmatch(r"v\d+", lines[0]):
            raise DamagedFile(uri, "no version line such as v1 at its start")
        try:
            metadata = json.loads(lines[1]) if len(lines) > 1 else {}
            offsets: dict[PartitionKey, int] = {}
            for line in lines[2:]:
                if not line.startswith("{"):
                    continue  # "-": a source with no offsets yet
                for topic, partitions in json.loads(line).items():
                    for partition, offset in partitions.items():
                        offsets[(topic, int(partition))] = int(offset)
        except (ValueError, TypeError, AttributeError) as error:
            raise DamagedFile(uri, f"not Spark's offsets: {error}") from error
        return offsets, metadata.get("batchTimestampMs")


def _reader_in(stored: Any, uri: str) -> str:
    """The reader a checkpoint's `main_reader.json` (content `stored`) names."""
    reader = stored.get("source") if isinstance(stored, dict) else None
    if reader not in READERS:
        raise DamagedFile(uri, 'it names no reader ("python" or "builtin")')
    return reader


def expired_state(folder: str, names: Iterable[str], batch_id: int) -> list[str]:
    """The entries of retrylib's `folder` (`STAGING_FOLDER`, "manifests" or "key_order") to
    delete once batch `batch_id` is done: staging folders of earlier batches (a replay of this
    one may still read its own), manifests older than the last `MANIFESTS_KEPT`, key queues
    but the last two, and temporary files of writes that crashed. Names retrylib does not
    write are left alone.
    """
    expired = []
    if folder == "key_order":
        numbers = sorted(int(name[:-5]) for name in names if _is_numbered_json(name))
        kept = set(numbers[-KEY_ORDER_KEPT:])
        return [
            name
            for name in names
            if (_is_numbered_json(name) and int(name[:-5]) not in kept)
            or (f".json{TEMPORARY_MARK}" in name and name.partition(".json")[0].isdigit())
        ]
    for name in names:
        if folder == STAGING_FOLDER:
            if name.isdigit() and int(name) < batch_id:
                expired.append(name)
            continue
        number, _, rest = name.partition(".json")
        if not number.isdigit():
            continue
        leftover = rest.startswith(TEMPORARY_MARK) and int(number) <= batch_id  # a crashed write
        if leftover or int(number) < batch_id - MANIFESTS_KEPT:
            expired.append(name)
    return expired


def _is_numbered_json(name: str) -> bool:
    return name.endswith(".json") and name[:-5].isdigit()
