"""`ReadToEnd` and `last_marker` on a scripted stand-in for a read_committed consumer."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from retrylib.errors import MarkerReadError
from retrylib.kafka import reading
from retrylib.kafka.reading import ReadToEnd, last_marker


class FakeMessage:
    def __init__(self, topic: str, partition: int, offset: int, key=None, value=None, error=None):
        self._where = (topic, partition, offset)
        self._key, self._value, self._error = key, value, error

    def topic(self) -> str:
        return self._where[0]

    def partition(self) -> int:
        return self._where[1]

    def offset(self) -> int:
        return self._where[2]

    def key(self):
        return self._key

    def value(self):
        return self._value

    def error(self):
        return self._error


class FakeConsumer:
    """A log per partition: {offset: (key, value)}; offsets missing from it hold no committed
    record (markers, aborted transactions). The end (EOF) is `ends[key]`, reported once the
    reader passes the last record."""

    def __init__(self, logs: dict, ends: dict, *, silent: bool = False) -> None:
        self.logs, self.ends, self.silent = logs, ends, silent
        self.position: dict = {}
        self.assigned: list = []
        self.unassigned = 0

    def get_watermark_offsets(self, tp, timeout, cached):
        return (
            min(self.logs[(tp.topic, tp.partition)], default=0),
            self.ends[(tp.topic, tp.partition)],
        )

    def assign(self, partitions) -> None:
        self.assigned.append([(tp.topic, tp.partition, tp.offset) for tp in partitions])
        self.position = {(tp.topic, tp.partition): tp.offset for tp in partitions}

    def unassign(self) -> None:
        self.position = {}
        self.unassigned += 1

    def poll(self, timeout: float):
        first = self.consume(1, timeout)
        return first[0] if first else None

    def consume(self, wanted: int, timeout: float) -> list:
        if self.silent:
            return []
        out = []
        for key, offset in list(self.position.items()):
            log = self.logs[key]
            later = sorted(o for o in log if o >= offset)
            for o in later[: wanted - len(out)]:
                out.append(FakeMessage(*key, o, *log[o]))
                self.position[key] = o + 1
            if len(out) < wanted and self.position[key] is not None:
                eof = KafkaError(KafkaError._PARTITION_EOF)
                out.append(FakeMessage(*key, self.ends[key], error=eof))
                self.position[key] = None
        self.position = {k: v for k, v in self.position.items() if v is not None}
        return out


A0, A1 = ("a", 0), ("a", 1)


def test_a_read_ends_at_the_end_offsets_and_skips_offsets_without_records() -> None:
    consumer = FakeConsumer({A0: {0: (b"k", b"0"), 2: (b"k", b"2"), 7: (b"k", b"7")}}, {A0: 5})
    read = ReadToEnd.from_earliest(consumer, [A0])

    assert [m.offset() for m in read.messages(timeout_s=5)] == [0, 2]
    assert read.unfinished == {}


def test_a_read_unassigns_its_partitions_at_its_end_and_when_left_part_way() -> None:
    # An assigned consumer goes on fetching: every 10 ms once at the end (fetch.wait.max.ms).
    consumer = FakeConsumer({A0: {o: (None, b"x") for o in range(3)}}, {A0: 3})
    assert len(list(ReadToEnd(consumer, {A0: 0}).messages(timeout_s=5))) == 3
    assert consumer.unassigned == 1

    for _ in ReadToEnd(consumer, {A0: 0}).messages(timeout_s=5):
        break
    assert consumer.unassigned == 2


def test_the_read_takes_what_has_arrived_without_waiting_for_a_full_batch() -> None:
    # consume(n, timeout) waits out its timeout whenever fewer than n arrive: a read of a
    # few records took two such waits, one for the records and one for the partition's end.
    class Timed(FakeConsumer):
        waited = 0.0

        def consume(self, wanted, timeout):
            got = super().consume(wanted, timeout)
            if len(got) < wanted:
                self.waited += timeout
            return got

    consumer = Timed({A0: {o: (None, b"x") for o in range(3)}}, {A0: 3})
    assert len(list(ReadToEnd(consumer, {A0: 0}).messages(timeout_s=5))) == 3
    assert consumer.waited == 0.0


def test_a_read_stops_at_its_limit_and_names_what_is_left() -> None:
    logs = {A0: {o: (None, b"x") for o in range(4)}, A1: {o: (None, b"y") for o in range(3)}}
    read = ReadToEnd(FakeConsumer(logs, {A0: 4, A1: 3}), {A0: 1, A1: 0})

    assert len(list(read.messages(timeout_s=5, limit=2))) == 2
    assert read.unfinished and set(read.unfinished) <= {A0, A1}


def test_a_read_names_the_partitions_whose_log_ended_before_their_end_offset() -> None:
    # An open transaction holds a read_committed read at offset 2; partition 1's topic was
    # created again with no record since its end (3) was listed.
    logs = {A0: {0: (None, b"x")}, A1: {}}
    read = ReadToEnd(FakeConsumer(logs, {A0: 2, A1: 0}), {A0: 0, A1: 0}, {A0: 5, A1: 3})

    assert [m.offset() for m in read.messages(timeout_s=5)] == [0]
    assert read.ended_short == {A0, A1} and read.unfinished == {}


def test_a_partition_already_at_its_end_is_not_read() -> None:
    consumer = FakeConsumer({A0: {0: (None, b"x")}}, {A0: 1})
    read = ReadToEnd(consumer, {A0: 1})

    assert list(read.messages(timeout_s=5)) == []
    assert consumer.assigned == [] and read.unfinished == {}


def test_a_read_out_of_time_leaves_its_partitions_unfinished(monkeypatch) -> None:
    monkeypatch.setattr(reading, "_CONSUME_WAIT_S", 0.0)
    read = ReadToEnd(FakeConsumer({A0: {0: (None, b"x")}}, {A0: 1}, silent=True), {A0: 0})

    assert list(read.messages(timeout_s=0.05)) == []
    assert read.unfinished == {A0: 0}


def test_an_error_other_than_the_end_is_raised() -> None:
    class Failing(FakeConsumer):
        def consume(self, wanted, timeout):
            return [FakeMessage("a", 0, 0, error=KafkaError(KafkaError._TRANSPORT))]

    with pytest.raises(KafkaException):
        list(ReadToEnd(Failing({A0: {}}, {A0: 3}), {A0: 0}).messages(timeout_s=5))


def test_the_last_marker_is_found_behind_many_offsets_without_one() -> None:
    control = ("_retrylib.j.produced", 0)
    log = {3: (b"app", b"7"), 4: (b"other", b"9"), 5: (b"app", b"not a number")}
    log.update({o: (b"other", b"1") for o in range(6, 300)})
    consumer = FakeConsumer({control: log}, {control: 300})

    def number_of(key: bytes):
        return lambda m: int(m.value()) if m.key() == key and m.value().isdigit() else None

    assert last_marker(consumer, control[0], number_of(b"app")) == 7
    assert last_marker(consumer, control[0], number_of(b"none")) is None


def test_a_marker_read_that_gets_no_answer_fails(monkeypatch) -> None:
    monkeypatch.setattr(reading, "MARKER_READ_TIMEOUT_S", 0.05)
    monkeypatch.setattr(reading, "_CONSUME_WAIT_S", 0.0)
    control = ("c", 0)
    consumer = FakeConsumer({control: {0: (b"app", b"1")}}, {control: 1}, silent=True)

    with pytest.raises(MarkerReadError, match="c offsets 0..1: no answer"):
        last_marker(consumer, "c", lambda message: 1)


def test_serve_raises_the_kafka_error_behind_a_callbacks_system_error():
    fenced = KafkaException(KafkaError(KafkaError._FENCED, "fenced"))

    def flush(timeout: float) -> int:
        try:
            raise fenced
        except KafkaException as cause:
            raise SystemError("callback raised") from cause

    with pytest.raises(KafkaException) as raised:
        reading.serve(flush, 1.0)
    assert raised.value is fenced
