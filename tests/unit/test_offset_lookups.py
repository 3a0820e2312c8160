"""The tier source's offset look-ups ask again while the cluster settles (a partition's
leader being elected, as right after partitions are added) and fail on anything else.

The consumer is a fake that answers `offsets_for_times` from a script; no broker.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from confluent_kafka import KafkaError, KafkaException

from retrylib.errors import KafkaSourceError
from retrylib.source import lookups as source
from retrylib.source.lookups import KafkaLookups as _Metadata


class ScriptedConsumer:
    """Answers each `offsets_for_times` call with the next step: an exception to raise, or
    an error code for every partition (None: offset 7 for each)."""

    def __init__(self, *steps) -> None:
        self.steps = list(steps)
        self.calls = 0

    def offsets_for_times(self, partitions, timeout):
        self.calls += 1
        step = self.steps.pop(0)
        if isinstance(step, BaseException):
            raise step
        error = None if step is None else KafkaError(step)
        return [
            SimpleNamespace(topic=p.topic, partition=p.partition, offset=7, error=error)
            for p in partitions
        ]


def metadata(consumer: ScriptedConsumer) -> _Metadata:
    looked_up = object.__new__(_Metadata)
    looked_up._consumer = consumer
    return looked_up


@pytest.fixture(autouse=True)
def no_pause(monkeypatch):
    monkeypatch.setattr(source, "_RETRY_PAUSE_S", 0)


def test_a_request_refused_while_leaders_move_is_asked_again() -> None:
    not_leader = KafkaException(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION))
    consumer = ScriptedConsumer(not_leader, KafkaError.LEADER_NOT_AVAILABLE, None)
    assert metadata(consumer).list_offsets([("t", 0), ("t", 1)], -1) == {("t", 0): 7, ("t", 1): 7}
    assert consumer.calls == 3


def test_other_errors_fail_the_look_up_at_once() -> None:
    denied = KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))
    with pytest.raises(KafkaException):
        metadata(ScriptedConsumer(denied)).list_offsets([("t", 0)], -1)
    consumer = ScriptedConsumer(KafkaError.TOPIC_AUTHORIZATION_FAILED)
    with pytest.raises(KafkaSourceError, match=r"listing offsets of t\[0\] failed"):
        metadata(consumer).list_offsets([("t", 0)], -1)
    assert consumer.calls == 1
