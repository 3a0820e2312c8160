"""Creating the job's topics: `ensure_topics` returns only once the broker lists them."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace

import pytest

from retrylib.errors import TopicError
from retrylib.kafka import clients
from retrylib.kafka.clients import ensure_topics, partition_counts


class LaggingAdmin:
    """An AdminClient whose metadata lists a created topic only `lag` look-ups later, as a
    busy broker's metadata cache does."""

    def __init__(self, lag: int) -> None:
        self.lag = lag
        self.created: dict[str, tuple[int, int]] = {}  # topic -> (partitions, look-ups left)

    def create_topics(self, topics, operation_timeout):
        futures = {}
        for new in topics:
            self.created[new.topic] = (new.num_partitions, self.lag)
            futures[new.topic] = done = Future()
            done.set_result(None)
        return futures

    def list_topics(self, timeout):
        listed = {}
        for topic, (partitions, left) in self.created.items():
            if left:
                self.created[topic] = (partitions, left - 1)
            else:
                listed[topic] = SimpleNamespace(
                    error=None, partitions=dict.fromkeys(range(partitions))
                )
        return SimpleNamespace(topics=listed)


@pytest.fixture(autouse=True)
def _no_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clients, "_METADATA_POLL_S", 0.0, raising=False)


def test_created_topics_are_listed_when_ensure_topics_returns() -> None:
    admin = LaggingAdmin(lag=5)

    ensure_topics(admin, {"orders.job.retry.5s": 3, "orders.job.dlt": 2}, create=True)

    assert partition_counts(admin, ["orders.job.retry.5s", "orders.job.dlt"]) == {
        "orders.job.retry.5s": 3,
        "orders.job.dlt": 2,
    }


def test_a_topic_the_broker_never_lists_is_named() -> None:
    admin = LaggingAdmin(lag=10**9)

    with pytest.raises(
        TopicError, match=r"created topic\(s\) \['orders.job.dlt'\], but the broker"
    ):
        ensure_topics(admin, {"orders.job.dlt": 2}, create=True, timeout=0.05)
