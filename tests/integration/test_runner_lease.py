"""The lease that lets one copy of a job (or of its redrive) run at a time, on the test
broker: refused while a live copy holds it, free at once when the holder leaves, and within
the session timeout when the holder is killed."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
from confluent_kafka.admin import AdminClient

from retrylib.errors import LeaseHeld, TopicError
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


def test_a_lease_on_a_missing_topic_is_refused_at_once(bootstrap_servers):
    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    with pytest.raises(TopicError, match="'_retrylib.nowhere.produced' does not exist"):
        take_lease(
            bootstrap_servers, {}, admin, topic="_retrylib.nowhere.produced", group="g", what="x"
        )
