"""Creating the job's topics: `ensure_topics` returns only once the broker lists them, made
with the replication and configs asked for."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace

import pytest
from confluent_kafka import KafkaError, KafkaException

from retrylib.errors import TopicError
from retrylib.kafka import clients
from retrylib.kafka.clients import ensure_topics, partition_counts


class LaggingAdmin:
    """An AdminClient whose metadata lists a created topic only `lag` look-ups later, as a
    busy broker's metadata cache does."""

    def __init__(self, lag: int, brokers: int = 1, refused_config: str | None = None) -> None:
        self.lag = lag
        self.brokers = dict.fromkeys(range(brokers))
        self.refused_config = refused_config  # a config this broker does not know
        self.created: dict[str, tuple[int, int]] = {}  # topic -> (partitions, look-ups left)
        self.made: dict[str, tuple[int, dict]] = {}  # topic -> (replication, configs)

    def create_topics(self, topics, operation_timeout):
        futures = {}
        for new in topics:
            futures[new.topic] = done = Future()
            if self.refused_config in (new.config or {}):
                done.set_exception(KafkaException(KafkaError(KafkaError.INVALID_CONFIG)))
                continue
            self.created[new.topic] = (new.num_partitions, self.lag)
            self.made[new.topic] = (new.replication_factor, dict(new.config or {}))
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
        return SimpleNamespace(topics=listed, brokers=self.brokers)


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


@pytest.mark.parametrize(("brokers", "replicas"), [(1, 1), (2, 2), (3, 3), (6, 3)])
def test_topics_get_three_replicas_or_one_per_broker_on_a_smaller_cluster(
    brokers: int, replicas: int
) -> None:
    admin = LaggingAdmin(lag=0, brokers=brokers)

    ensure_topics(admin, {"orders.job.dlt": 2}, create=True)

    assert admin.made == {"orders.job.dlt": (replicas, {})}


def test_a_config_the_broker_refuses_is_dropped_only_when_optional() -> None:
    admin = LaggingAdmin(lag=0, brokers=3, refused_config="message.timestamp.after.max.ms")
    tier = "orders.job.retry.5s"
    kept = {"retention.ms": "86400000"}

    ensure_topics(
        admin,
        {tier: 3},
        create=True,
        configs={tier: kept},
        optional_configs={tier: {"message.timestamp.after.max.ms": "305000"}},
        replication_factor=2,
    )
    assert admin.made == {tier: (2, kept)}

    with pytest.raises(TopicError, match="could not create topic 'orders.job.dlt'"):
        ensure_topics(
            admin,
            {"orders.job.dlt": 3},
            create=True,
            configs={"orders.job.dlt": {"message.timestamp.after.max.ms": "1"}},
        )
