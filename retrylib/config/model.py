"""The job config as frozen dataclasses, one per TOML table; `loader.load_config` builds them.

Every duration is in whole milliseconds (fields named `..._ms`), the unit the whole job works in.

Values that came from `${env:NAME}`, and Kafka options whose names look secret, are hidden
(`secrets.is_hidden`): `Config.redacted()` shows them as "***", config messages never echo
them, and `Config.secret_values()` gives them to the log masking.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from types import MappingProxyType
from typing import Any

from retrylib.config.client_security import KafkaSecurity, java_security, librdkafka_security
from retrylib.config.schema import OutputSchema
from retrylib.config.secrets import MASK, OPTION_TABLES, is_hidden
from retrylib.config.table_ref import TableRef
from retrylib.config.topic_names import ANY_TOPIC


@dataclass(frozen=True)
class JobConfig:
    """[job]: the streaming query's name, its checkpoint and its trigger interval.

    The Delta writes' app id is not the name but the checkpoint's own ("<name>-<random>",
    `Checkpoint.app_id`), so a new checkpoint starts a new app id.
    """

    name: str
    checkpoint: str
    trigger_ms: int
    # On SIGTERM/SIGINT: how long the batch running may take to finish before it is cancelled.
    stop_timeout_ms: int


class _ReadOnlyMappings:
    """Base of the config dataclasses that hold mappings: any Mapping given is stored as a
    read-only copy (MappingProxyType), and pickles as a plain dict, since pickle cannot
    handle a mappingproxy.
    """

    def __post_init__(self) -> None:
        for f in fields(self):  # type: ignore[arg-type]  # subclasses are dataclasses
            value = getattr(self, f.name)
            if isinstance(value, Mapping):
                object.__setattr__(self, f.name, MappingProxyType(dict(value)))

    def __reduce__(self) -> tuple[type, tuple[Any, ...]]:
        values = (getattr(self, f.name) for f in fields(self))  # type: ignore[arg-type]
        return type(self), tuple(dict(v) if isinstance(v, Mapping) else v for v in values)


TIER_TIMESTAMP_CONFIG = "message.timestamp.after.max.ms"
"""The topic config the job sets on each retry topic it creates (`job.start.prepare_topics`)."""


@dataclass(frozen=True)
class NewTopics(_ReadOnlyMappings):
    """[kafka.new_topics]: how the job creates the topics it makes when they are missing
    (retry tiers, dead-letter topics, a delay router's fallback topic, the control topic).

    `replication_factor` None: three copies, or one per broker on a smaller cluster.
    `partitions` None: a tier or dead-letter topic gets as many as the main topic it serves
    (the most of them for a shared one), a fallback topic the most of the delay topics.
    `configs` are topic configs of those topics. The control topic keeps one partition and
    its broker defaults; it takes the replication factor only.
    """

    replication_factor: int | None = None
    partitions: int | None = None
    configs: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class KafkaConfig(_ReadOnlyMappings):
    """[kafka]: where to read the main topics, and how its clients connect.

    The job runs two kinds of Kafka client: Spark's connector (Java) for the main topics and
    librdkafka's for everything else. `security` is written for both (see
    `retrylib.config.client_security`); `options` go to both as they are; `java_options` and
    `librdkafka_options` go to one kind each and win over the rest.

    With `fail_on_data_loss` false, records deleted from Kafka before the job read them
    (retention, delete-records) and deleted topics are skipped with a warning, else they
    fail the query.
    """

    bootstrap_servers: str
    topics: tuple[str, ...]
    starting_offsets: str
    max_offsets_per_trigger: int | None
    source: str
    create_topics: bool
    options: Mapping[str, str]
    security: KafkaSecurity | None = None
    java_options: Mapping[str, str] = field(default_factory=dict)
    librdkafka_options: Mapping[str, str] = field(default_factory=dict)
    import_paths: tuple[str, ...] = ()  # where the token provider is imported from
    starting_timestamp_ms: int | None = None  # starting_offsets as a time, in epoch ms
    fail_on_data_loss: bool = True
    topic_pattern: str | None = None  # main topics by name, instead of `topics` (then empty)
    new_topics: NewTopics = field(default_factory=NewTopics)

    def topic_keys(self) -> tuple[str, ...]:
        """The main topics as the retry tiers are keyed: each of `topics`, or `ANY_TOPIC`."""
        return self.topics or (ANY_TOPIC,)

    def client_options(self) -> dict[str, str]:
        """The options of every librdkafka client the job makes (without the brokers)."""
        return {
            **librdkafka_security(self.security, self.import_paths),
            **self.options,
            **self.librdkafka_options,
        }

    def spark_options(self) -> dict[str, str]:
        """The options of Spark's Kafka connector, without the "kafka." prefix it wants."""
        return {**java_security(self.security), **self.options, **self.java_options}


@dataclass(frozen=True)
class HandlerConfig:
    """[handler]: the user's function, the schema of what it returns, and where to import it."""

    function: str
    output_schema: OutputSchema
    paths: tuple[str, ...]
    timeout_ms: int | None  # the longest one handler call (or record hook call) may run
    kind: str = "record"  # "record": one call per record; "arrow"/"pandas": one per batch
    parallelism: int = 1  # concurrent calls per Spark task, records spread by key (`lanes`)


@dataclass(frozen=True)
class OutputConfig(_ReadOnlyMappings):
    """[output]: the Delta table the handler's results go to (a path/URI or a catalog name).

    `partition_by` and `properties` apply when the job creates the table; with
    `schema_evolution`, columns the output schema has and the table lacks are added.
    `optimize_every_ms`, when set, is how often the job compacts its tables (Delta's
    OPTIMIZE; see `compaction`).
    """

    table: str
    partition_by: tuple[str, ...] = ()
    properties: Mapping[str, str] = field(default_factory=dict)
    schema_evolution: bool = False
    optimize_every_ms: int | None = None

    def table_ref(self) -> TableRef:
        return TableRef.parse(self.table, "output.table")  # checked when the config loaded


@dataclass(frozen=True)
class RetryTier(_ReadOnlyMappings):
    """One delay tier: retry number `index + 1` waits `delay_ms` in `topics[main_topic]`."""

    index: int
    delay_ms: int
    topics: Mapping[str, str]


@dataclass(frozen=True)
class RetryConfig:
    """[retry]: delay tiers, how many handler calls a record gets, and what never retries."""

    delays_ms: tuple[int, ...]
    max_attempts: int
    jitter: float
    non_retryable: tuple[str, ...]
    tiers: tuple[RetryTier, ...]
    max_retry_after_ms: int
    timeout_ms: int | None = None  # total retry time from the first failure; None: no limit
    key_ordered: bool = False  # a key's later records wait behind its retries (`retry.key_order`)
    # A tier's records due this long after a batch starts are read in it and wait in the task.
    read_ahead_ms: int = 0

    def tier_topics(self) -> tuple[str, ...]:
        """Every retry topic, tier by tier, in the order of the main topics."""
        return tuple(topic for tier in self.tiers for topic in tier.topics.values())

    def tier_delays_ms(self) -> dict[str, int]:
        """The delay of every retry topic, in milliseconds."""
        return {topic: tier.delay_ms for tier in self.tiers for topic in tier.topics.values()}


@dataclass(frozen=True)
class DeadLetterConfig:
    """[dead_letter]: where records go when they are out of attempts or non-retryable.

    `routes` send a record whose last error is an instance of a class (by name, in order:
    the first match wins) to a topic of its own instead of `topic`. `max_redrives`: a record
    dead-lettered again after that many redrives is not redriven again unless asked.
    """

    topic: str
    table: str
    routes: tuple[tuple[str, str], ...] = ()
    max_redrives: int = 3

    def topics(self) -> tuple[str, ...]:
        """Every dead-letter topic: the default one, then each route's."""
        return tuple(dict.fromkeys([self.topic, *(topic for _, topic in self.routes)]))

    def table_ref(self) -> TableRef:
        return TableRef.parse(self.table, "dead_letter.table")  # checked when the config loaded


@dataclass(frozen=True)
class DelayRouterConfig(_ReadOnlyMappings):
    """The [delay_router] section of a delay router's config (`DelayRouterJobConfig`): a job
    that forwards records after a delay and calls no handler.

    A record on one of `topics` (delay topic -> delay) names its destination topic in the
    header `target_header` and when it was sent, in epoch seconds, in `timestamp_header`
    (Kafka-Retry-Router's `final_topic` and `msg_ts`). Once that time plus the topic's
    delay has passed, the record is produced as it is to its destination. A record whose
    destination is missing or not a topic of the cluster goes to `fallback_topic`, or, with
    none, is logged at ERROR and counted (`task.forwarding`).
    """

    topics: Mapping[str, int]
    target_header: str = "final_topic"
    timestamp_header: str = "msg_ts"
    fallback_topic: str | None = None
    # A delay topic's records due this long after a batch starts are read in it and wait.
    read_ahead_ms: int = 0
    # A record sent further ahead of the router's clock than this goes to the fallback.
    max_timestamp_ahead_ms: int = 3_600_000


@dataclass(frozen=True)
class MetricsConfig:
    """[metrics]: an optional Delta table of per-batch counts; how often a batch's metrics
    read the dead letters waiting from the dead-letter table."""

    table: str | None
    dead_letter_every_ms: int = 60_000

    def table_ref(self) -> TableRef | None:
        """The table, checked when the config loaded; None when there is none."""
        return None if self.table is None else TableRef.parse(self.table, "metrics.table")


@dataclass(frozen=True)
class BreakerConfig:
    """[breaker]: stop taking main-topic records while most of them fail (see `breaker`)."""

    failure_share: float  # trips above this share of failed main-topic records (0 < x <= 1)
    window: int  # over the outcomes of at least this many latest main-topic records
    probe_every_ms: int  # while open, lets `probe_records` main-topic records in this often
    probe_records: int
    health: str | None = None  # "module:function" the driver asks whether the downstream is up
    health_every_ms: int = 5_000
    health_timeout_ms: int = 2_000


RECORD_HOOKS = ("before_record", "after_record", "on_retry", "on_dead_letter")
"""The hooks called on the executors, per record (see `retrylib.task.hooks`)."""
BATCH_HOOKS = ("on_batch_start", "on_batch_end")
"""The hooks called on the driver, per batch."""
HOOKS = (*RECORD_HOOKS, *BATCH_HOOKS)


@dataclass(frozen=True)
class HooksConfig:
    """[hooks]: the user's lifecycle hooks, each "module:function" or None (see `hooks`)."""

    before_record: str | None = None
    after_record: str | None = None
    on_retry: str | None = None
    on_dead_letter: str | None = None
    on_batch_start: str | None = None
    on_batch_end: str | None = None
    # How long the driver waits for a batch hook's call before it goes on without it.
    timeout_ms: int = 30_000

    def references(self, names: tuple[str, ...] = HOOKS) -> dict[str, str]:
        """Hook name -> reference, for those of `names` that are set."""
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}


class _ConfigCommon:
    """The rules over what every job's config holds (`Config`, `DelayRouterJobConfig`): how
    it is printed, what it hides, how its Kafka clients log in."""

    job: JobConfig
    kafka: KafkaConfig
    metrics: MetricsConfig
    source_path: str
    from_env: frozenset[str]
    env_variables: frozenset[str]

    def redacted(self) -> dict[str, Any]:
        """The config as plain nested dicts and lists, safe to print.

        Hidden values (`secrets.is_hidden`: Kafka options whose names look secret, the login's
        password, every value that came from ${env:...}) are replaced by "***".
        """
        return self._plain(lambda key, value: MASK if is_hidden(key, self.from_env) else value)

    def secret_values(self) -> set[str]:
        """The values `redacted()` hides, as they are, and the value of each environment
        variable the config refers to with ${env:NAME} (it may be only part of a hidden
        value): what log lines and printed text must mask (`retrylib.logs.redact_secrets`).
        """
        secrets = {os.environ.get(name, "") for name in self.env_variables}

        def keep_hidden(key: str, value: Any) -> Any:
            if value is not None and is_hidden(key, self.from_env):
                secrets.add(str(value))
            return value

        self._plain(keep_hidden)
        return {secret for secret in secrets if secret}

    def _plain(self, leaf: Callable[[str, Any], Any]) -> dict[str, Any]:
        """The config as plain nested dicts and lists, each scalar replaced by `leaf(dotted
        key, value)`."""
        return {
            f.name: _plain(getattr(self, f.name), f.name, leaf)
            for f in fields(self)
            if f.name not in ("from_env", "env_variables")
        }

    def kafka_login(self) -> str:
        """How the Kafka clients log in, for error messages: no secret, and the user name
        only when it did not come from the environment."""
        security = self.kafka.security or KafkaSecurity()
        return security.describe(user_shown="kafka.security.username" not in self.from_env)

    def secret_options(self) -> tuple[str, ...]:
        """Names of the librdkafka options (`KafkaConfig.client_options`) whose values
        `redacted()` hides: what a process that only has the options (a Spark worker) must
        mask.
        """
        kafka = self.kafka
        entries = [
            (f"{table}.{name}", value)
            for table, options in zip(
                OPTION_TABLES,
                (kafka.options, kafka.java_options, kafka.librdkafka_options),
                strict=True,
            )
            for name, value in options.items()
        ]
        if kafka.security is not None:
            entries += [
                (f"kafka.security.{f.name}", getattr(kafka.security, f.name))
                for f in fields(kafka.security)
            ]
        hidden = {value for key, value in entries if is_hidden(key, self.from_env)}
        return tuple(name for name, value in kafka.client_options().items() if value in hidden)


@dataclass(frozen=True)
class Config(_ConfigCommon):
    """A handler job's whole, validated config. `from_env` holds the dotted keys set from
    ${env:...}, `env_variables` the names of the environment variables they refer to."""

    job: JobConfig
    kafka: KafkaConfig
    handler: HandlerConfig
    output: OutputConfig
    retry: RetryConfig
    dead_letter: DeadLetterConfig
    metrics: MetricsConfig
    source_path: str
    from_env: frozenset[str] = field(default=frozenset(), repr=False)
    hooks: HooksConfig = field(default_factory=HooksConfig)
    breaker: BreakerConfig | None = None
    env_variables: frozenset[str] = field(default=frozenset(), repr=False)

    def delayed_topics(self) -> dict[str, int]:
        """Topic -> delay (ms) of every topic the job reads only as far as is due: the
        retry tiers."""
        return self.retry.tier_delays_ms()

    def read_ahead_ms(self) -> int:
        """How long before they are due the job reads the records of `delayed_topics`."""
        return self.retry.read_ahead_ms

    def stamps_delayed_topics_ahead(self) -> bool:
        """Whether the job's own producers stamp records of `delayed_topics` ahead of their
        clock: a handler job's retry hops do, up to one delay (`policy.tier_timestamp_ms`)."""
        return True


@dataclass(frozen=True)
class DelayRouterJobConfig(_ConfigCommon):
    """A delay router's whole, validated config, its [delay_router] section in `delay_router`
    (`DelayRouterConfig`): it forwards records and calls no handler, so it has no handler,
    output, retry, dead letter, hooks or breaker."""

    job: JobConfig
    kafka: KafkaConfig
    delay_router: DelayRouterConfig
    metrics: MetricsConfig
    source_path: str
    from_env: frozenset[str] = field(default=frozenset(), repr=False)
    env_variables: frozenset[str] = field(default=frozenset(), repr=False)

    def delayed_topics(self) -> dict[str, int]:
        """Topic -> delay (ms) of every topic the job reads only as far as is due: the
        delay topics."""
        return dict(self.delay_router.topics)

    def read_ahead_ms(self) -> int:
        """How long before they are due the job reads the records of `delayed_topics`."""
        return self.delay_router.read_ahead_ms

    def stamps_delayed_topics_ahead(self) -> bool:
        """False: a delay router holds records stamped no later than now (`forwarding.hold`)."""
        return False


AnyConfig = Config | DelayRouterJobConfig
"""What `loader.load_config` gives: a handler job's config or a delay router's."""


def _plain(value: Any, key: str, leaf: Callable[[str, Any], Any]) -> Any:
    """`value` (at dotted `key`) as plain dicts, lists and scalars, each scalar replaced by
    `leaf(its dotted key, it)`; an output schema is its DDL."""
    if isinstance(value, OutputSchema):
        return value.ddl
    if is_dataclass(value):
        return {
            f.name: _plain(getattr(value, f.name), f"{key}.{f.name}", leaf) for f in fields(value)
        }
    if isinstance(value, Mapping):
        return {k: _plain(v, f"{key}.{k}", leaf) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [_plain(v, f"{key}[{i}]", leaf) for i, v in enumerate(value)]
    return leaf(key, value)
