"""Kafka clients (consumer, producer, admin) built from one place, and topic administration.

Every client the job creates goes through here, so the user's pass-through options
(`security.protocol`, `sasl.*`, `ssl.*`, ...) reach all of them, and so does the masking of
their secret values: in whichever process a client is made (driver, Python data source
worker, executor), librdkafka's log lines and the errors raised here show them as "***".
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from retrylib.config.client_security import TOKEN_PROVIDER_OPTION, TOKEN_PROVIDER_PATHS_OPTION
from retrylib.config.importing import import_object
from retrylib.config.secrets import is_secret_key
from retrylib.config.topic_names import subscribed
from retrylib.errors import KafkaConnectError, TopicError
from retrylib.kafka.record_size import MIN_RECORD_LIMIT_BYTES, largest_record, producer_limit
from retrylib.logs import KAFKA_CLIENT_LOGGER, redact, redact_secrets

log = logging.getLogger(__name__)

# fetch.wait.max.ms: how long the broker holds a fetch that finds nothing new. Reads of a
# range and of the control topic end at the partition's end, and librdkafka reports that end
# (EOF) only after such an empty fetch: measured on Apache Kafka 4.1, EOF came 0.1 s after
# the last record with 100 ms and 0.5 s with librdkafka's default of 500 ms.
_METADATA_POLL_S = 0.2
_LOGIN_POLL_S = 1.0  # one metadata request's wait while logging in
# Connection errors that trying again cannot cure, and what they mean.
_REFUSALS = {
    KafkaError._AUTHENTICATION: "refused the login",
    KafkaError._SSL: "failed the TLS handshake",
}
_CONSUMER_DEFAULTS = {
    "enable.auto.commit": False,
    "enable.partition.eof": False,
    "fetch.wait.max.ms": 100,
}
_PRODUCER_DEFAULTS = {
    "enable.idempotence": True,
    "linger.ms": 5,
    "compression.type": "lz4",
}


def client_config(
    bootstrap_servers: str, options: Mapping[str, object], secret_options: Collection[str] = ()
) -> dict[str, object]:
    """The settings shared by every client: the brokers, the user's pass-through options, and
    a logger so that librdkafka's own lines go through logging and its masking instead of
    straight to stderr.

    The values of options named in `secret_options` or looking secret (`is_secret_key`) are
    masked from then on in this process's log lines (see `retrylib.logs`), in whatever
    process this runs: the driver knows the config's secrets, a worker knows only these.
    """
    redact_secrets(
        str(value)
        for name, value in options.items()
        if name in secret_options or is_secret_key(name)
    )
    config: dict[str, object] = {
        "bootstrap.servers": bootstrap_servers,
        "logger": logging.getLogger(KAFKA_CLIENT_LOGGER),
        **dict(options),
    }
    provider = token_callback(config)
    if provider is not None:
        config["oauth_cb"] = provider
    return config


def token_callback(options: dict[str, object]) -> Callable[[str], tuple] | None:
    """Take the token provider's pseudo options out of librdkafka `options` and return the
    provider itself (confluent-kafka's `oauth_cb`), imported in this process; None when
    there is none.

    Raises `ImportError` or `AttributeError` naming the reference when it does not resolve.
    """
    reference = options.pop(TOKEN_PROVIDER_OPTION, None)
    paths = json.loads(str(options.pop(TOKEN_PROVIDER_PATHS_OPTION, "[]")))
    if reference is None:
        return None
    provider = import_object(str(reference), paths)
    if not callable(provider):
        raise TypeError(f"kafka.security.token_provider {reference!r} is not callable")
    return provider


def _create(kind: type, config: Mapping[str, object]):
    """`kind(config)`, raising `KafkaException` with secrets masked when librdkafka refuses
    the configuration: the error would otherwise carry a value to an executor's log.
    """
    try:
        return kind(dict(config))
    except KafkaException as e:
        error = e.args[0]
        # Not chained: the original message is what must not be shown.
        raise KafkaException(KafkaError(error.code(), redact(error.str()))) from None


def kafka_error_text(error: KafkaException) -> str:
    """What a `KafkaException` says: librdkafka's message for the `KafkaError` it carries
    (without the error code's name and number that `str()` adds), else `str()` of it.
    """
    first = error.args[0] if error.args else error
    return first.str() if hasattr(first, "str") else str(first)


def make_consumer(
    bootstrap_servers: str,
    options: Mapping[str, object],
    group_id: str = "retrylib-reader",
    *,
    secret_options: Collection[str] = (),
) -> Consumer:
    """A consumer that never commits offsets to Kafka: for explicit `assign()` reads, or a
    group membership of its own (`runner_lease`, whose `options` carry its callbacks).

    `secret_options` names options whose values are masked (see `client_config`). Raises
    `KafkaException` when librdkafka refuses the configuration.
    """
    config = {**_CONSUMER_DEFAULTS, "group.id": group_id}
    config.update(client_config(bootstrap_servers, options, secret_options))
    return _create(Consumer, config)


def make_producer(
    bootstrap_servers: str, options: Mapping[str, str], *, secret_options: Collection[str] = ()
) -> Producer:
    """An idempotent producer (no duplicates from the producer's own retries).

    `secret_options` as for `make_consumer`; raises `KafkaException` as it does.
    """
    return _create(
        Producer,
        {**_PRODUCER_DEFAULTS, **client_config(bootstrap_servers, options, secret_options)},
    )


def make_admin(bootstrap_servers: str, options: Mapping[str, str]) -> AdminClient:
    """An admin client; raises `KafkaException` when librdkafka refuses the configuration."""
    return _create(AdminClient, client_config(bootstrap_servers, options))


def connected_admin(
    bootstrap_servers: str, options: Mapping[str, str], login: str, timeout: float = 30.0
) -> AdminClient:
    """An admin client that has reached the brokers and logged in.

    Raises `KafkaConnectError` as soon as the brokers refuse the login or the TLS handshake
    fails (a wrong password or CA would otherwise show only as a time-out), or when none
    answers within `timeout`. Its
    message names the brokers and `login` (how the job logs in, never a secret).
    """
    refusals: list[KafkaError] = []
    config = client_config(bootstrap_servers, options)
    config["error_cb"] = refusals.append
    admin = _create(AdminClient, config)
    deadline = time.monotonic() + timeout
    while True:
        try:
            admin.list_topics(timeout=_LOGIN_POLL_S)
            return admin
        except KafkaException as e:
            last = kafka_error_text(e)
        admin.poll(0)
        refused = login_refusal(refusals, bootstrap_servers, login)
        if refused is not None:
            raise KafkaConnectError(refused)
        if time.monotonic() >= deadline:
            reason = redact(refusals[-1].str()) if refusals else last
            raise KafkaConnectError(
                f"no Kafka broker at {bootstrap_servers} answered within {timeout:g}s "
                f"({login}): {reason}"
            )


def login_refusal(errors: Iterable[KafkaError], bootstrap_servers: str, login: str) -> str | None:
    """What the first of a client's connection `errors` that no retry can cure says (the
    brokers refused the login, or the TLS handshake failed), naming the brokers and `login`
    (how the job logs in, never a secret); None when there is none."""
    for error in errors:
        if error.code() in _REFUSALS:
            return (
                f"the Kafka brokers at {bootstrap_servers} {_REFUSALS[error.code()]} "
                f"({login}): {redact(error.str())}; check kafka.security"
            )
    return None


def topic_partitions(
    client: AdminClient | Consumer,
    topics: Iterable[str],
    timeout: float = 15.0,
    pattern: str | None = None,
) -> dict[str, list[int]]:
    """Partition numbers of each existing topic among `topics`, then of every topic whose
    whole name matches `pattern` (sorted; Kafka's internal "__" topics left out, as Kafka's
    consumers leave them out of pattern subscriptions), from one fetch of `client`'s fresh
    metadata; missing topics (and topics the broker reports an error for) are left out.

    Raises `KafkaException` when the broker does not answer within `timeout`.
    """
    metadata = client.list_topics(timeout=timeout)
    wanted = list(topics)
    if pattern is not None:
        wanted += sorted(
            name
            for name in metadata.topics
            if name not in wanted and not name.startswith("__") and subscribed(name, (), pattern)
        )
    found = {}
    for topic in wanted:
        info = metadata.topics.get(topic)
        if info is not None and info.error is None and info.partitions:
            found[topic] = sorted(info.partitions)
    return found


def partition_counts(
    admin: AdminClient, topics: Iterable[str], timeout: float = 15.0, pattern: str | None = None
) -> dict[str, int]:
    """Partition count of each existing topic among `topics` and matching `pattern` (see
    `topic_partitions`); missing topics are left out."""
    found = topic_partitions(admin, topics, timeout, pattern)
    return {topic: len(partitions) for topic, partitions in found.items()}


DEFAULT_REPLICATION_FACTOR = 3
"""Copies of each topic the job creates, unless the config says otherwise or the cluster has
fewer brokers."""


def ensure_topics(
    admin: AdminClient,
    wanted: Mapping[str, int],
    *,
    create: bool,
    configs: Mapping[str, Mapping[str, str]] | None = None,
    optional_configs: Mapping[str, Mapping[str, str]] | None = None,
    replication_factor: int | None = None,
    timeout: float = 30.0,
) -> None:
    """Make sure every topic in `wanted` (topic -> partition count) exists.

    Missing topics are created when `create` is true, otherwise `TopicError` names them. A
    topic is created with `replication_factor` copies (None: `DEFAULT_REPLICATION_FACTOR`,
    or one per broker when the cluster has fewer), its `configs` and its `optional_configs`
    (topic -> topic configs); a broker that refuses an optional config gets the topic
    without those, with a warning. A topic created concurrently by someone else counts as
    existing. Returns once the broker's metadata shows every created topic, so that a
    look-up right after finds it; raises `TopicError` when it does not within `timeout`.
    """
    missing = sorted(set(wanted) - set(partition_counts(admin, wanted)))
    if not missing:
        return
    if not create:
        raise TopicError(
            f"missing topic(s) {missing}: create them, or set [kafka] create_topics = true"
        )
    if replication_factor is None:
        brokers = len(admin.list_topics(timeout=timeout).brokers)
        replication_factor = max(min(DEFAULT_REPLICATION_FACTOR, brokers), 1)
    for topic in missing:
        required = dict((configs or {}).get(topic, {}))
        optional = dict((optional_configs or {}).get(topic, {}))
        new = NewTopic(topic, wanted[topic], replication_factor, config={**optional, **required})
        try:
            _create_topic(admin, new, timeout)
        except Exception as e:
            if not (optional and "INVALID_CONFIG" in str(e)):
                raise TopicError(f"could not create topic {topic!r}: {e}") from e
            log.warning(
                "the brokers refused topic configs %s for %s (%s); creating it without them",
                optional,
                topic,
                e,
            )
            _create_topic(
                admin, NewTopic(topic, wanted[topic], replication_factor, config=required), timeout
            )
    _await_metadata(admin, missing, timeout)


def _await_metadata(admin: AdminClient, topics: list[str], timeout: float) -> None:
    """Wait until the broker's metadata lists every topic of `topics`.

    A broker answers CreateTopics once its controller has recorded the topic; its metadata
    cache follows a little later (seconds on a busy machine), and until then a metadata
    look-up leaves the topic out.
    """
    deadline = time.monotonic() + timeout
    while True:
        unseen = sorted(set(topics) - set(partition_counts(admin, topics)))
        if not unseen:
            return
        if time.monotonic() >= deadline:
            raise TopicError(
                f"created topic(s) {unseen}, but the broker's metadata still does not list "
                f"them after {timeout:.0f}s; check the broker's health and start again"
            )
        time.sleep(_METADATA_POLL_S)


def _create_topic(admin: AdminClient, new: NewTopic, timeout: float) -> None:
    [future] = admin.create_topics([new], operation_timeout=timeout).values()
    try:
        future.result(timeout)
        log.info(
            "created topic %s with %d partitions, %d replicas, configs %s",
            new.topic,
            new.num_partitions,
            new.replication_factor,
            new.config,
        )
    except Exception as e:  # KafkaException carries TOPIC_ALREADY_EXISTS on a race
        if "TOPIC_ALREADY_EXISTS" not in str(e):
            raise


def topic_max_message_bytes(
    admin: AdminClient, topics: Iterable[str], timeout: float = 15.0
) -> dict[str, int]:
    """Each topic's `max.message.bytes`: its own setting, else the broker's default.

    Raises `KafkaException` when the broker does not answer within `timeout` or a topic
    does not exist.
    """
    resources = [ConfigResource(ConfigResource.Type.TOPIC, topic) for topic in topics]
    if not resources:  # a delay router without a fallback topic: the client refuses none
        return {}
    futures = admin.describe_configs(resources, request_timeout=timeout)
    return {
        resource.name: int(future.result(timeout)["max.message.bytes"].value)
        for resource, future in futures.items()
    }


class RecordLimits:
    """The largest record each topic retrylib produces to (retry tiers, dead-letter topic)
    accepts: the smaller of its `max.message.bytes` and retrylib's producer's
    `message.max.bytes` (`record_size.producer_limit` of the job's Kafka options).

    `current()` looks the topics up again, so a changed topic setting applies from the next
    batch; when the broker does not answer it keeps the last known limits, which the first
    call must have found. The set of topics is fixed, so the cache does not grow.
    """

    def __init__(
        self, bootstrap_servers: str, options: Mapping[str, str], topics: Iterable[str]
    ) -> None:
        """Raises `ConfigError` naming the option when `message.max.bytes` is not a number."""
        self._admin = make_admin(bootstrap_servers, options)
        self._producer_max = producer_limit(options)
        self._topics = tuple(sorted(set(topics)))
        self.topic_max: dict[str, int] = {}
        """Each topic's own `max.message.bytes` at the last successful look-up."""

    def current(self) -> dict[str, int]:
        """Topic -> the largest record (as `record_size.wire_size` counts) it accepts.

        Raises `TopicError` when the broker does not answer and no earlier look-up did, and
        when a topic takes less than `MIN_RECORD_LIMIT_BYTES`, naming the topic and the fix.
        """
        try:
            found = topic_max_message_bytes(self._admin, self._topics)
        except KafkaException as e:
            if not self.topic_max:
                raise TopicError(
                    f"could not read max.message.bytes of topic(s) {list(self._topics)}: {e}"
                ) from e
            log.warning("max.message.bytes look-up failed (%s); using the last known values", e)
            found = self.topic_max
        limits = {topic: largest_record(self._producer_max, found[topic]) for topic in found}
        for topic, limit in limits.items():
            if limit < MIN_RECORD_LIMIT_BYTES:
                raise TopicError(
                    f"topic {topic!r} takes records of at most {limit} bytes (its "
                    f"max.message.bytes is {found[topic]}, message.max.bytes in "
                    f"kafka.options {self._producer_max}): retrylib needs at least "
                    f"{MIN_RECORD_LIMIT_BYTES} for its retry and dead-letter headers; "
                    "raise the smaller of the two"
                )
        self.topic_max = dict(found)
        return limits
