"""One runner at a time: a lease held as the one member of a Kafka consumer group that is
assigned a one-partition topic.

Kafka is what every copy of a job reaches, from any host of a cluster and whatever holds the
checkpoint (a lock file holds on one disk only; object stores differ in what atomic writes
they offer). The group coordinator keeps a member while it heartbeats and drops it
`session.timeout.ms` after its last heartbeat, so a holder that died frees the lease within
that bound, and one that stops frees it at once. With the cooperative-sticky assignor a
member keeps its partition when another joins: the newcomer's rebalance ends with nothing
assigned, which says that a live member holds the lease, and the newcomer is refused with
the holder's name (its `client.id`). The partition is paused: nothing is fetched or
committed.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from retrylib.config.locations import location_id
from retrylib.config.topic_names import CONTROL_TOPIC_PREFIX
from retrylib.errors import LeaseHeld, TopicError
from retrylib.kafka.clients import make_consumer, partition_counts

log = logging.getLogger(__name__)

LEASE_SESSION_TIMEOUT_MS = 10_000
"""How long after a holder's last heartbeat the lease is free again (a holder that died)."""
_POLL_S = 0.5  # the holder's poll: rebalances are answered within it
_MAX_POLL_INTERVAL_MS = 60_000  # a holder whose poll thread stalls this long lets go
# A newcomer's wait for its rebalance: a dead holder's session running out, the broker's
# delay before a new group's first assignment (group.initial.rebalance.delay.ms, 3 s by
# default), and a live holder's answer, with room to spare.
_TAKE_WAIT_S = (LEASE_SESSION_TIMEOUT_MS + _MAX_POLL_INTERVAL_MS) / 1000 + 15


def runner_group(job_name: str, checkpoint: str) -> str:
    """The lease group of the job running from `checkpoint`: one runner per place, however
    it is spelled (`location_id`: symlinks, scheme aliases, trailing slashes)."""
    digest = hashlib.sha256(location_id(checkpoint).encode()).hexdigest()[:16]
    return f"{CONTROL_TOPIC_PREFIX}{job_name}.runner.{digest}"


def redrive_group(job_name: str) -> str:
    """The lease group of the job's redrives: one redrive per dead-letter table at a time."""
    return f"{CONTROL_TOPIC_PREFIX}{job_name}.redrive"


def holder_id(what: str) -> str:
    """How a holder names itself to the others (its consumer's `client.id`)."""
    since = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"retrylib {what} host={socket.gethostname()} pid={os.getpid()} since={since}"


class RunnerLease:
    """A held lease; `release()` frees it. While held, a daemon thread polls the group, and
    says in one line when the brokers stop answering and in one when they answer again.

    `held` is set while this member holds the partition. A lease lost (the broker unreachable
    past the session timeout) is taken again when the group answers and no other member took
    it meanwhile; `taken_over` is set when one did.
    """

    def __init__(
        self, bootstrap_servers: str, options: Mapping[str, str], *, group: str, what: str
    ) -> None:
        self.group = group
        self.what = what
        self.held = threading.Event()
        self.taken_over = threading.Event()
        self._answered = threading.Event()
        self._bootstrap_servers = bootstrap_servers
        self._away_since: float | None = None
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._poller = threading.Thread(
            target=self._poll, name=f"retrylib-lease-{group}", daemon=True
        )
        self._consumer = make_consumer(
            bootstrap_servers,
            {
                **options,
                "error_cb": self._on_error,
                "client.id": holder_id(what),
                "partition.assignment.strategy": "cooperative-sticky",
                "session.timeout.ms": str(LEASE_SESSION_TIMEOUT_MS),
                "heartbeat.interval.ms": str(LEASE_SESSION_TIMEOUT_MS // 5),
                "max.poll.interval.ms": str(_MAX_POLL_INTERVAL_MS),
            },
            group,
        )

    @property
    def answered(self) -> bool:
        """True once the group's rebalance has answered this member, holding or not."""
        return self._answered.is_set()

    def join(self, topic: str, wait_s: float) -> bool:
        """Join the group on `topic` and wait up to `wait_s` for its answer; True when this
        member holds the lease (and is kept in the group by a poll thread from then on)."""
        self._consumer.subscribe([topic], on_assign=self._on_assign, on_lost=self._on_lost)
        deadline = time.monotonic() + wait_s
        while not self._answered.is_set() and time.monotonic() < deadline:
            self._consumer.poll(0.2)
        if self.held.is_set():
            self._poller.start()
        return self.held.is_set()

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        consumer.incremental_assign(partitions)
        if partitions:
            consumer.pause(partitions)
            if self._answered.is_set() and not self.held.is_set():
                log.warning("%s: holding the lease %s again", self.what, self.group)
            self.held.set()
        elif not self.held.is_set():
            self.taken_over.set()
        self._answered.set()

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        consumer.incremental_unassign(partitions)
        if partitions and self.held.is_set():
            self.held.clear()
            log.warning(
                "%s: lost the lease %s (the brokers did not hear from it within %d ms); "
                "taking it again once they do",
                self.what,
                self.group,
                LEASE_SESSION_TIMEOUT_MS,
            )

    def _on_error(self, error: KafkaError) -> None:
        if error.code() == KafkaError._ALL_BROKERS_DOWN and self._away_since is None:
            self._away_since = time.monotonic()
            log.warning(
                "%s: the Kafka brokers at %s do not answer; the job waits for them "
                "(their clients' own lines are shown at most once a minute)",
                self.what,
                self._bootstrap_servers,
            )

    def _poll(self) -> None:
        while not self._closed.is_set():
            with self._lock:
                if self._closed.is_set():
                    return
                self._consumer.poll(_POLL_S)
                if self._away_since is not None:
                    self._look_for_brokers()
            time.sleep(0.01)  # lets release() take the lock

    def _look_for_brokers(self) -> None:
        """While the brokers are away: one line when they answer again."""
        try:
            self._consumer.list_topics(timeout=_POLL_S)
        except KafkaException:
            return
        log.warning(
            "%s: the Kafka brokers at %s answer again, after %.0fs",
            self.what,
            self._bootstrap_servers,
            time.monotonic() - self._away_since,
        )
        self._away_since = None

    def release(self) -> None:
        """Leave the group: the lease is free at once. Safe to call twice."""
        if self._closed.is_set():
            return
        with self._lock:
            self._closed.set()
            try:
                self._consumer.close()
            except (KafkaException, RuntimeError) as e:  # the brokers gone: it expires
                log.warning("%s: leaving the lease %s: %s", self.what, self.group, e)


def take_lease(
    bootstrap_servers: str,
    options: Mapping[str, str],
    admin: AdminClient,
    *,
    topic: str,
    group: str,
    what: str,
    wait_s: float = _TAKE_WAIT_S,
) -> RunnerLease:
    """Hold the lease `group` on the one-partition `topic`, or raise `LeaseHeld` naming the
    member that holds it (`TopicError` when `topic` does not exist: nothing can hold it).

    Waits for the group's rebalance: up to `LEASE_SESSION_TIMEOUT_MS` when the last holder
    died without leaving.
    """
    if topic not in partition_counts(admin, [topic]):  # a look-up that creates nothing
        raise TopicError(f"the lease topic {topic!r} does not exist; the job creates it")
    lease = RunnerLease(bootstrap_servers, options, group=group, what=what)
    if lease.join(topic, wait_s):
        log.info("%s holds the lease %s", what, group)
        return lease
    lease.release()
    if not lease.answered:
        raise LeaseHeld(
            f"{what}: no answer from the brokers for the lease {group} within {wait_s:.0f}s; "
            "is another copy starting? Try again"
        )
    raise LeaseHeld(
        f"{what}: another copy holds the lease {group}: {_holder(admin, group)}. Stop that "
        f"one first; a copy that died frees it within {LEASE_SESSION_TIMEOUT_MS // 1000}s"
    )


def _holder(admin: AdminClient, group: str) -> str:
    """The `client.id` of the group's member that holds a partition, as the broker says."""
    try:
        [future] = admin.describe_consumer_groups([group], request_timeout=15).values()
        description = future.result()
    except KafkaException as e:
        return f"(the brokers did not describe the group: {e})"
    for member in description.members:
        if member.assignment is not None and member.assignment.topic_partitions:
            return member.client_id
    return "(a member that is rejoining)"
