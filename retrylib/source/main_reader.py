"""Which reader takes a job's main topics: retrylib's own source or Spark's Kafka connector.

`kafka.source = "auto"` (the default) gives a new checkpoint retrylib's own source
(`"python"`): its routing tasks read their offset ranges from Kafka themselves, so records
never cross into the JVM and a small batch skips the connector's round trips (the figures,
and where they were measured, are in docs/performance.md). It is also the only reader that
carries the breaker and key order. `"builtin"` picks Spark's connector, as a user who needs
its Java client options may.

A checkpoint keeps the reader it was started with: Spark checkpoints the query's sources, and
the two readers make different sources (the connector is a second source beside the tiers'),
so a resumed query whose reader changed would fail in Spark with no word of why. The choice
is recorded in the checkpoint (`Checkpoint.main_reader`). A checkpoint started before that
record existed was started by "auto" with the connector whenever it was on the classpath.
"""

from __future__ import annotations

from collections.abc import Callable

from retrylib.errors import RetrylibError

CONNECTOR = "builtin"
OWN_SOURCE = "python"
READERS = (CONNECTOR, OWN_SOURCE)


def main_reader(
    configured: str,
    recorded: str | None,
    resumed: bool,
    connector_on_classpath: Callable[[], bool],
    record: str,
) -> str:
    """The reader of the main topics ("builtin" or "python") for `kafka.source = configured`.

    `recorded`: the reader in the checkpoint's record `record` (None when it has none);
    `resumed`: Spark's checkpoint holds a planned batch, so the query's sources are fixed.
    Raises `RetrylibError` when the config names the other reader than a resumed checkpoint
    was started with.
    """
    if resumed and recorded is not None and configured not in ("auto", recorded):
        raise RetrylibError(
            f'kafka.source = "{configured}", but this checkpoint was started reading the main '
            f'topics with "{recorded}" ({record}), and Spark cannot resume a query whose '
            f'sources changed: set kafka.source = "{recorded}" (or "auto"), or start the job '
            "from a new checkpoint (job.checkpoint)"
        )
    if configured != "auto":
        return configured
    if recorded is not None:
        return recorded
    if resumed:  # started before the choice was recorded
        return CONNECTOR if connector_on_classpath() else OWN_SOURCE
    return OWN_SOURCE
