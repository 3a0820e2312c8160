"""The lease that lets one copy of a job (or of its redrive) run at a time, on the test
broker: refused while a live copy holds it, free at once when the holder leaves, and within
the session timeout when the holder is killed."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid

import pytest
from confluent_kafka.admin import AdminClient
from helpers import wait_for

from retrylib.dev.broker import EmbeddedBroker
from retrylib.errors import LeaseHeld, TopicError
from retrylib.kafka.clients import ensure_topics, make_admin, partition_counts
from retrylib.kafka.runner_lease import LEASE_SESSION_TIMEOUT_MS, take_lease

_HOLD = """
import sys, time
from confluent_kafka.admin import AdminClient
from retrylib.kafka.runner_lease import take_lease
lease = take_lease(sys.argv[1], {}, AdminClient({"bootstrap.servers": sys.argv[1]}),
                   topic=sys.argv[2], group=sys.argv[3], what="holder")
print("held", flush=True)
time.sleep(600)
"""


def test_a_second_taker_is_refused_until_the_holder_is_gone(bootstrap_servers, make_topic):
    topic = make_topic("lease", partitions=1)
    group = f"_retrylib.{topic}.runner"
    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, bootstrap_servers, topic, group],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(LeaseHeld, match=f"retrylib holder host=.* pid={holder.pid} since="):
            take_lease(bootstrap_servers, {}, admin, topic=topic, group=group, what="second")
        assert holder.poll() is None  # the holder goes on

        holder.send_signal(signal.SIGKILL)  # dies without leaving the group
        holder.wait()
        started = time.monotonic()
        lease = take_lease(bootstrap_servers, {}, admin, topic=topic, group=group, what="next")
        waited = time.monotonic() - started
    finally:
        if holder.poll() is None:
            holder.kill()
    assert lease.held.is_set()
    assert waited < LEASE_SESSION_TIMEOUT_MS / 1000 + 5
    lease.release()
    # Left, not died: free at once.
    started = time.monotonic()
    take_lease(bootstrap_servers, {}, admin, topic=topic, group=group, what="last").release()
    assert time.monotonic() - started < LEASE_SESSION_TIMEOUT_MS / 1000


def test_a_lease_on_a_missing_topic_is_refused_at_once_and_creates_nothing(bootstrap_servers):
    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    topic = f"_retrylib.nowhere-{uuid.uuid4().hex[:8]}.produced"
    with pytest.raises(TopicError, match=f"'{topic}' does not exist"):
        take_lease(bootstrap_servers, {}, admin, topic=topic, group="g", what="x")
    assert partition_counts(admin, [topic]) == {}  # a broker that creates topics on a look-up


def test_a_runner_rides_out_a_broker_outage_longer_than_its_session(tmp_path, caplog):
    """The brokers away past the session timeout: the runner says so once, and once more
    when they are back, and holds its lease again (no other copy took it)."""
    with EmbeddedBroker(data_dir=tmp_path / "broker") as broker:
        bootstrap = broker.bootstrap_servers
        admin = make_admin(bootstrap, {})
        ensure_topics(admin, {"_retrylib.outage.produced": 1}, create=True)
        lease = take_lease(
            bootstrap,
            {},
            admin,
            topic="_retrylib.outage.produced",
            group="_retrylib.outage.runner",
            what="job 'outage'",
        )
        try:
            broker.stop()
            wait_for(lambda: "do not answer" in caplog.text, 30, "the lease's failed renewal")
            time.sleep(LEASE_SESSION_TIMEOUT_MS / 1000 + 2)
            broker.start()
            wait_for(
                lambda: "answer again" in caplog.text and lease.held.is_set(), 60, "the lease again"
            )
            assert not lease.taken_over.is_set()
        finally:
            lease.release()
    lines = [r.getMessage() for r in caplog.records if r.name == "retrylib.kafka.runner_lease"]
    assert sum("do not answer" in line for line in lines) == 1, lines
    assert sum("answer again, after" in line for line in lines) == 1, lines
