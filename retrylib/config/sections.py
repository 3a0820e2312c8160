"""Reading each table of the config file ([job], [kafka], [handler], [output], [retry],
[dead_letter], [metrics]) into its `model` dataclass, checking what lies within it.

Each reader returns None when anything it checked was a problem (recorded in `t.problems`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from retrylib.config.importing import import_object
from retrylib.config.kafka_options import JOB_OWNED_OPTIONS, option_problem
from retrylib.config.locations import check_table_name
from retrylib.config.model import (
    ANY_TOPIC,
    HOOKS,
    TIER_TIMESTAMP_CONFIG,
    BreakerConfig,
    DeadLetterConfig,
    DelayRouterConfig,
    HandlerConfig,
    HooksConfig,
    JobConfig,
    KafkaConfig,
    MetricsConfig,
    NewTopics,
    OutputConfig,
    RetryConfig,
    RetryTier,
)
from retrylib.config.schema import OutputSchema, parse_schema
from retrylib.config.secrets import MASK, is_hidden
from retrylib.config.security import check_security, read_security
from retrylib.config.topic_names import produced_topic, redriven_topic
from retrylib.config.topics import check_dead_letter_topics, explicit_tiers, template_tiers
from retrylib.config.values import (
    BOOL,
    EXCEPTION_REF,
    FUNCTION_REF,
    HANDLER_KIND,
    JOB_NAME,
    NON_EMPTY_LIST,
    PERCENT,
    POSITIVE_INT,
    SCALAR,
    SOURCE,
    STARTING_OFFSETS,
    TEXT,
    TOPIC,
    TOPIC_PATTERN,
    TOPIC_TEMPLATE,
    Problems,
    Table,
    instant_ms,
    is_topic,
)

_DEFAULT_DELAYS = ("10s", "1m", "10m")
# A retry due within this of a batch's start is read in that batch and waits in its task, so
# it is handled on time rather than a batch later; about a batch's length on a small cluster.
DEFAULT_READ_AHEAD = "2s"
# As Kafka's brokers accept a CreateTime ahead of their clock (log.message.timestamp.after.max.ms).
DEFAULT_MAX_TIMESTAMP_AHEAD = "1h"
# A batch hook that takes longer holds up its batch; past it the batch goes on without it.
DEFAULT_HOOK_TIMEOUT = "30s"
DEFAULT_HANDLER_TIMEOUT = "5m"  # as Kafka's max.poll.interval.ms: a slow call, not a hung one
_MAX_PARALLELISM = 256  # lanes (threads) per Spark task
_MAX_READ_AHEAD_MS = 60_000  # a record read ahead holds its task's slot until it is due
_DEFAULT_TOPIC_TEMPLATE = "{topic}.{job}.retry.{delay}"
_DEFAULT_DEAD_LETTER_TOPIC = "{topic}.{job}.dlt"
_PATTERN_TOPIC_TEMPLATE = "{job}.retry.{delay}"  # kafka.topic_pattern: the job's own tiers
_PATTERN_DEAD_LETTER_TOPIC = "{job}.dlt"
_MIN_DEFAULT_MAX_RETRY_AFTER_MS = 3_600_000


def read_job(t: Table) -> JobConfig | None:
    name = t.get("name", JOB_NAME, 'name = "orders"')
    checkpoint = t.get("checkpoint", TEXT, 'checkpoint = "/tmp/retrylib/orders/checkpoint"')
    trigger = t.duration("trigger", 'trigger = "1s"', "1s", positive=False)
    stop_timeout = t.duration("stop_timeout", 'stop_timeout = "2m"', "2m", positive=True)
    t.finish()
    return JobConfig(name, checkpoint, trigger, stop_timeout) if t.ok else None


_ROUTER_READS = (
    "a delay router reads the topics of [delay_router], each from its earliest record, "
    "with retrylib's own source"
)


def read_kafka(t: Table, *, router: bool = False) -> KafkaConfig | None:
    """[kafka]; for a delay router (`router`), without the keys about main topics."""
    servers = t.get("bootstrap_servers", TEXT, 'bootstrap_servers = "127.0.0.1:9092"')
    if router:
        for key in ("topics", "topic_pattern", "starting_offsets", "source"):
            if key in t.data:
                t.refuse(key, f"{_ROUTER_READS}; remove kafka.{key}")
        t.values["topics"] = topics = pattern = None
    else:
        topics, pattern = _main_topics(t)
    starting = "earliest"
    if not router:
        example = 'starting_offsets = "earliest"'
        starting = t.get("starting_offsets", STARTING_OFFSETS, example, starting)
    max_offsets = t.get(
        "max_offsets_per_trigger", POSITIVE_INT, "max_offsets_per_trigger = 100000", None
    )
    starting_ms = instant_ms(starting)
    fail_on_data_loss = t.get("fail_on_data_loss", BOOL, "fail_on_data_loss = true", True)
    source = "python" if router else t.get("source", SOURCE, 'source = "auto"', "auto")
    create_topics = t.get("create_topics", BOOL, "create_topics = true", True)
    options = _kafka_options(
        t.table("options", '[kafka.options] "client.id" = "x"', required=False)
    )
    java_options = _kafka_options(
        t.table("java_options", '[kafka.java_options] "sasl.jaas.config" = "..."', required=False),
        librdkafka=False,
    )
    librdkafka_options = _kafka_options(
        t.table(
            "librdkafka_options",
            '[kafka.librdkafka_options] "socket.nagle.disable" = true',
            required=False,
        )
    )
    security = read_security(
        t.table("security", '[kafka.security] protocol = "SASL_SSL"', required=False)
    )
    new_topics = _new_topics(
        t.table("new_topics", "[kafka.new_topics] replication_factor = 3", required=False)
    )
    t.finish()
    if security is not None:
        check_security(t, security, options, java_options, librdkafka_options, source)
    per_partition = starting not in (None, "earliest", "latest") and starting_ms is None
    if per_partition and topics:
        unknown = sorted(set(json.loads(starting)) - set(topics))
        if unknown:
            t.problems.add(
                t.path("starting_offsets"),
                f"names topics {json.dumps(unknown)} that are not in kafka.topics; "
                "give offsets only for the topics the job reads",
            )
    if per_partition and pattern:
        t.problems.add(
            t.path("starting_offsets"),
            "gives offsets per topic, but the job reads kafka.topic_pattern, whose topics "
            'come and go; start from "earliest", "latest" or a time',
        )
    if not t.ok:
        return None
    return KafkaConfig(
        servers,
        topics or (),
        starting if isinstance(starting, str) else starting.isoformat(),
        max_offsets,
        source,
        create_topics,
        options,
        security,
        java_options,
        librdkafka_options,
        starting_timestamp_ms=starting_ms,
        fail_on_data_loss=fail_on_data_loss,
        topic_pattern=pattern,
        new_topics=new_topics,
    )


def _new_topics(t: Table) -> NewTopics:
    """[kafka.new_topics]: replication, partitions and topic configs of the topics the job
    creates; absent keys leave the choice to the job (`NewTopics`)."""
    replication = t.get("replication_factor", POSITIVE_INT, "replication_factor = 3", None)
    partitions = t.get("partitions", POSITIVE_INT, "partitions = 6", None)
    example = '[kafka.new_topics.configs] "retention.ms" = "604800000"'
    configs = _options(t.table("configs", example, required=False))
    t.finish()
    if TIER_TIMESTAMP_CONFIG in configs:
        t.problems.add(
            t.path(f"configs.{TIER_TIMESTAMP_CONFIG}"),
            "set by the job on each retry topic (its delay plus an allowance for clocks that "
            "disagree, so that a retry stamped due later is accepted); remove it",
        )
    return NewTopics(replication, partitions, configs)


def _main_topics(t: Table) -> tuple[tuple[str, ...] | None, str | None]:
    """kafka.topics, or kafka.topic_pattern: (topics, pattern), None for what is absent."""
    pattern = t.get("topic_pattern", TOPIC_PATTERN, r'topic_pattern = "orders\\..*"', None)
    if "topic_pattern" not in t.data:
        return t.strings("topics", TOPIC, 'topics = ["orders"]'), None
    if "topics" in t.data:
        t.get("topics", NON_EMPTY_LIST, 'topics = ["orders"]')
        t.problems.add(
            t.path("topic_pattern"), "set together with kafka.topics; keep only one of them"
        )
    # The retry tiers of a job reading a pattern are the job's, one set for every topic.
    t.values["topics"] = None if pattern is None else (ANY_TOPIC,)
    return None, pattern


def _options(t: Table) -> dict[str, str]:
    """Kafka client options as strings; booleans become "true"/"false" as Kafka spells them."""
    example = '"sasl.mechanism" = "PLAIN" (quote names that hold dots)'
    for name in t.data:
        t.get(name, SCALAR, example)
    return {
        name: str(value).lower() if isinstance(value, bool) else str(value)
        for name, value in t.data.items()
    }


def _kafka_options(t: Table, *, librdkafka: bool = True) -> dict[str, str]:
    """Kafka client options (`_options`), none of them one the job sets itself
    (`JOB_OWNED_OPTIONS`). With `librdkafka`, each is also checked the way librdkafka will
    take it, so that a bad one fails here rather than at the first client: a property
    librdkafka knows, a value it accepts.
    """
    options = _options(t)
    for name, value in options.items():
        key = t.path(name)
        if key in t.problems.unresolved or not SCALAR.accepts(t.data[name]):
            continue  # reported already
        if name in JOB_OWNED_OPTIONS:
            t.problems.add(key, f"set by the job itself: {JOB_OWNED_OPTIONS[name]}")
            continue
        if not librdkafka:
            continue
        reason = option_problem(name, value)
        if reason is None:
            continue
        if is_hidden(key, t.problems.from_env) and value:
            reason = reason.replace(value, MASK)
        if reason.startswith(("Invalid value", "Unsupported value")):
            fix = "give a value librdkafka accepts"
        elif name.startswith("kafka."):
            fix = f'drop the "kafka." prefix Spark uses: "{name.removeprefix("kafka.")}"'
        else:
            fix = (
                "the job's own Kafka clients are librdkafka's: use librdkafka's properties, "
                "put a login in [kafka.security] (written for every client), or a property "
                "of Spark's Java connector only in [kafka.java_options]"
            )
        t.problems.add(key, f"{reason.rstrip('.')}; {fix}")
    return options


def read_handler(t: Table, check_imports: bool, config_folder: str) -> HandlerConfig | None:
    """The [handler] table; relative `paths` are taken from `config_folder` (the config
    file's), so that the job imports the same handler from wherever it is started."""
    function = t.get("function", FUNCTION_REF, 'function = "orders_handlers.handlers:enrich_order"')
    ddl = t.get("output_schema", TEXT, 'output_schema = "order_id STRING, total DOUBLE"')
    paths = t.strings("paths", TEXT, 'paths = ["."]', ["."])
    timeout = t.duration("timeout", 'timeout = "30s"', DEFAULT_HANDLER_TIMEOUT, positive=True)
    kind = t.get("kind", HANDLER_KIND, 'kind = "record"', "record")
    parallelism = t.get("parallelism", POSITIVE_INT, "parallelism = 8", 1)
    t.finish()
    if parallelism and parallelism > _MAX_PARALLELISM:
        t.problems.add(
            t.path("parallelism"),
            f"at most {_MAX_PARALLELISM}: each lane is a thread with its own calls in every "
            "Spark task; write it like parallelism = 8",
        )
    elif parallelism and parallelism > 1 and kind not in (None, "record"):
        t.problems.add(
            t.path("parallelism"),
            f'spreads calls for one record at a time over lanes, but handler.kind = "{kind}" '
            "hands the handler whole batches; remove it, or use a record handler",
        )
    schema = _schema(t.problems, t.path("output_schema"), ddl) if ddl else None
    if paths:
        paths = t.values["paths"] = tuple(
            os.path.abspath(os.path.join(config_folder, p)) for p in paths
        )
        if check_imports and function:
            _check_import(t.problems, t.path("function"), function, paths, callable, "callable")
    if not t.ok:
        return None
    return HandlerConfig(function, schema, paths, timeout, kind, parallelism)


def _schema(problems: Problems, key: str, ddl: str) -> OutputSchema | None:
    try:
        return parse_schema(ddl)
    except ValueError as e:
        problems.add(
            key,
            f"bad schema {json.dumps(ddl)}: {e}; write Spark DDL like "
            '"order_id STRING, total DOUBLE"',
        )
        return None


def _check_import(
    problems: Problems,
    key: str,
    reference: str,
    paths: tuple[str, ...],
    test: Callable[[Any], bool],
    noun: str,
) -> None:
    """Record a problem unless `reference` imports (with `paths` on sys.path) and passes `test`."""
    try:
        target = import_object(reference, paths)
    except Exception as e:  # importing user code may raise anything; report it, don't crash
        problems.add(
            key,
            f"cannot import {json.dumps(reference)}: {type(e).__name__}: {e}; check the name and "
            f"that its module is under handler.paths {json.dumps(list(paths))}",
        )
        return
    if not test(target):
        problems.add(
            key, f"{json.dumps(reference)} is not {noun}, got {type(target).__name__}; name one"
        )


def read_output(t: Table, schema: OutputSchema | None) -> OutputConfig | None:
    table = t.get("table", TEXT, 'table = "/tmp/retrylib/orders/out"')
    check_table_name(t, "table", table)
    partition_by = t.strings(
        "partition_by", TEXT, 'partition_by = ["order_date"]', [], empty_ok=True
    )
    properties = _options(
        t.table("properties", '[output.properties] "delta.appendOnly" = "true"', required=False)
    )
    evolve = t.get("schema_evolution", BOOL, "schema_evolution = false", False)
    optimize_every = t.duration("optimize_every", 'optimize_every = "1h"', None, positive=True)
    t.finish()
    if schema is not None and partition_by:
        columns = {name.lower() for name in schema.names}
        for i, column in enumerate(partition_by):
            if column.lower() not in columns:
                t.problems.add(
                    f"{t.path('partition_by')}[{i}]",
                    f"{column!r} is not a column of handler.output_schema "
                    f"{list(schema.names)}; partition by one of them",
                )
    if not t.ok:
        return None
    return OutputConfig(
        table,
        tuple(partition_by or ()),
        properties,
        bool(evolve),
        optimize_every,
    )


def read_ahead_ms(t: Table) -> int | None:
    """`read_ahead` of [retry] or [delay_router]: how long before they are due the job reads
    its delayed topics' records, which then wait in their task (`retrylib.task.read_ahead`)."""
    read_ahead = t.duration("read_ahead", 'read_ahead = "2s"', DEFAULT_READ_AHEAD, positive=False)
    if read_ahead is not None and read_ahead > _MAX_READ_AHEAD_MS:
        t.problems.add(
            t.path("read_ahead"),
            "at most 1m: a record read ahead holds its task until it is due; "
            'write it like "2s", or "0s" to read only what is due',
        )
        return None
    return read_ahead


def read_retry(
    t: Table, main_topics: tuple[str, ...] | None, job_name: str | None
) -> RetryConfig | None:
    texts = t.get("delays", NON_EMPTY_LIST, 'delays = ["5s", "1m", "10m"]', [*_DEFAULT_DELAYS])
    delays = [
        t.problems.duration(f"{t.path('delays')}[{i}]", text, positive=True)
        for i, text in enumerate(texts or ())
    ]
    max_attempts = t.get("max_attempts", POSITIVE_INT, "max_attempts = 4", 4)
    jitter = t.get("jitter", PERCENT, 'jitter = "10%"', "0%")
    non_retryable = t.strings(
        "non_retryable", EXCEPTION_REF, 'non_retryable = ["ValueError"]', [], empty_ok=True
    )
    explicit = t.strings("topics", TOPIC, 'topics = ["orders.retry.5s", "orders.retry.1m"]', None)
    default_template = (
        _PATTERN_TOPIC_TEMPLATE if main_topics == (ANY_TOPIC,) else _DEFAULT_TOPIC_TEMPLATE
    )
    template_example = f"topic_template = {json.dumps(default_template)}"
    template = t.get("topic_template", TOPIC_TEMPLATE, template_example, default_template)
    max_retry_after = t.duration("max_retry_after", 'max_retry_after = "6h"', None, positive=True)
    timeout = t.duration("timeout", 'timeout = "1h"', None, positive=True)
    key_ordered = t.get("key_ordered", BOOL, "key_ordered = true", False)
    read_ahead = read_ahead_ms(t)
    t.finish()
    tiers = None
    if main_topics is not None and job_name and texts is not None and None not in delays:
        if explicit is not None:
            tiers = explicit_tiers(t, delays, main_topics, explicit)
        elif template is not None and "topics" not in t.data:
            tiers = template_tiers(t, delays, main_topics, job_name, template)
    t.values["tiers"] = tiers
    if not t.ok or tiers is None:
        return None
    if max_retry_after is None:
        max_retry_after = max(_MIN_DEFAULT_MAX_RETRY_AFTER_MS, *delays)
    return RetryConfig(
        tuple(delays),
        max_attempts,
        float(jitter[:-1]) / 100,
        non_retryable,
        tiers,
        max_retry_after,
        timeout,
        bool(key_ordered),
        read_ahead,
    )


def check_key_order(t: Table, source: str | None, handler_kind: str | None) -> None:
    """`retry.key_ordered` holds records inside retrylib's own Kafka source's tasks, which
    `kafka.source = "python"` selects, and decides record by record."""
    if not t.values.get("key_ordered"):
        return
    if source is not None and source != "python":
        t.problems.add(
            t.path("key_ordered"),
            f'needs kafka.source = "python" (it is "{source}"): only retrylib\'s own Kafka '
            'source reads each key\'s partitions in one task; set kafka.source = "python" or '
            "remove retry.key_ordered",
        )
    if handler_kind is not None and handler_kind != "record":
        t.problems.add(
            t.path("key_ordered"),
            f'needs handler.kind = "record" (it is "{handler_kind}"): a key\'s records are '
            "held one by one; use a record handler or remove retry.key_ordered",
        )


def read_dead_letter(
    t: Table,
    main_topics: tuple[str, ...] | None,
    job_name: str | None,
    tiers: tuple[RetryTier, ...] | None,
    output_table: str | None,
) -> DeadLetterConfig | None:
    """The dead-letter topic (default "<first main topic>.<job>.dlt", or "<job>.dlt" with
    kafka.topic_pattern) and table (default
    "<output.table>_dead_letter"), the topic distinct from every main and retry topic.
    """
    default_topic = None
    if main_topics == (ANY_TOPIC,) and job_name:
        default_topic = _PATTERN_DEAD_LETTER_TOPIC.format(job=job_name)
    elif main_topics and job_name:
        default_topic = _DEFAULT_DEAD_LETTER_TOPIC.format(topic=main_topics[0], job=job_name)
    topic = t.get("topic", TOPIC, 'topic = "orders.dlt"', default_topic)
    default_table = f"{output_table.rstrip('/')}_dead_letter" if output_table else None
    table = t.get("table", TEXT, 'table = "/tmp/retrylib/orders/dead_letter"', default_table)
    t.values["table"] = table  # the default too, for check_locations
    if "table" in t.data:  # a default made from a bad output.table is reported there
        check_table_name(t, "table", table)
    routes_example = '[dead_letter.routes] "ValueError" = "orders.invalid.dlt"'
    routes = _dead_letter_routes(t.table("routes", routes_example, required=False))
    max_redrives = t.get("max_redrives", POSITIVE_INT, "max_redrives = 3", 3)
    t.finish()
    if topic and main_topics:
        check_dead_letter_topics(
            t.problems, main_topics, tiers or (), t.path("topic"), topic, routes
        )
    if not t.ok or topic is None or table is None:
        return None
    return DeadLetterConfig(topic, table, routes, max_redrives)


def _dead_letter_routes(t: Table) -> tuple[tuple[str, str], ...]:
    """[dead_letter.routes]: exception class name -> dead-letter topic, in the file's order.

    Several classes may share a topic; `check_exception_classes` checks the names import.
    """
    routes = []
    for reference in t.data:
        if not EXCEPTION_REF.accepts(reference):
            t.problems.add(
                t.path(reference),
                f"expected {EXCEPTION_REF.noun} as the name, got {json.dumps(reference)}; "
                'write it like "ValueError" = "orders.invalid.dlt"',
            )
            continue
        topic = t.get(reference, TOPIC, '"ValueError" = "orders.invalid.dlt"')
        if topic is not None:
            routes.append((reference, topic))
    return tuple(routes)


def read_hooks(t: Table, handler_kind: str | None) -> HooksConfig | None:
    """[hooks]: each hook a "module:function"; the two around a handler call only when the
    handler takes one record at a time."""
    references = {
        name: t.get(name, FUNCTION_REF, f'{name} = "hooks:{name}"', None) for name in HOOKS
    }
    timeout = t.duration("timeout", 'timeout = "30s"', DEFAULT_HOOK_TIMEOUT, positive=True)
    t.finish()
    if handler_kind not in (None, "record"):
        for name in ("before_record", "after_record"):
            if references[name] is not None:
                t.problems.add(
                    t.path(name),
                    f"is called around each handler call for one record, but handler.kind = "
                    f'"{handler_kind}" hands the handler whole batches; remove it (on_retry and '
                    "on_dead_letter are called for every handler kind)",
                )
    if not t.ok or timeout is None:
        return None
    return HooksConfig(**references, timeout_ms=timeout)


def read_metrics(t: Table) -> MetricsConfig | None:
    table = t.get("table", TEXT, 'table = "/tmp/retrylib/orders/metrics"', None)
    check_table_name(t, "table", table)
    every = t.duration("dead_letter_every", 'dead_letter_every = "1m"', "1m", positive=False)
    t.finish()
    return MetricsConfig(table, every) if t.ok and every is not None else None


def read_breaker(t: Table, source: str | None) -> BreakerConfig | None:
    """[breaker]: the failure share and window that trip it, and its probes. It holds the main
    topics in retrylib's own Kafka source, which `kafka.source = "python"` selects."""
    share = t.get("failure_share", PERCENT, 'failure_share = "50%"', "50%")
    window = t.get("window", POSITIVE_INT, "window = 1000", 1000)
    probe_every = t.duration("probe_every", 'probe_every = "30s"', "30s", positive=True)
    probe_records = t.get("probe_records", POSITIVE_INT, "probe_records = 10", 10)
    health = t.get("health", FUNCTION_REF, 'health = "orders_health:payments_up"', None)
    health_every = t.duration("health_every", 'health_every = "5s"', "5s", positive=True)
    health_timeout = t.duration("health_timeout", 'health_timeout = "2s"', "2s", positive=True)
    t.finish()
    if share is not None and float(share[:-1]) == 0:
        t.problems.add(
            t.path("failure_share"),
            'of "0%" would trip on the first failure and never close; give a share above 0%',
        )
    if source is not None and source != "python":
        t.problems.add(
            t.name,
            f'needs kafka.source = "python" (it is "{source}"): only retrylib\'s own Kafka source '
            "can stop reading the main topics while the query runs; set kafka.source = "
            '"python" or remove [breaker]',
        )
    if not t.ok or probe_every is None or health_every is None or health_timeout is None:
        return None
    return BreakerConfig(
        float(share[:-1]) / 100,
        window,
        probe_every,
        probe_records,
        health,
        health_every,
        health_timeout,
    )


def read_delay_router(t: Table, job_name: str | None) -> DelayRouterConfig | None:
    """[delay_router]: the delay topics with their delays, the two header names, and the
    fallback topic, which may not be one of the delay topics or the job's control topics."""
    example = '[delay_router.topics] "retry_topic_5min" = "5m"'
    topics = t.table("topics", example, required=True)
    delays = {}
    for name in topics.data:
        if not is_topic(name):
            topics.refuse(name, f"{TOPIC.noun} is needed, got {json.dumps(name)}; {example}")
        else:
            delays[name] = topics.duration(name, example, None, positive=True)
    if not topics.data and not topics.broken:
        t.problems.add(t.path("topics"), f"names no delay topic; add one, as {example}")
    target = t.get("target_header", TEXT, 'target_header = "final_topic"', "final_topic")
    stamp = t.get("timestamp_header", TEXT, 'timestamp_header = "msg_ts"', "msg_ts")
    fallback = t.get("fallback_topic", TOPIC, 'fallback_topic = "retry_fallback"', None)
    read_ahead = read_ahead_ms(t)
    max_ahead = t.duration(
        "max_timestamp_ahead",
        'max_timestamp_ahead = "1h"',
        DEFAULT_MAX_TIMESTAMP_AHEAD,
        positive=True,
    )
    t.finish()
    if target is not None and target == stamp:
        t.problems.add(
            t.path("timestamp_header"),
            f"is the same header as target_header ({json.dumps(target)}); name another one",
        )
    if fallback in delays:
        t.problems.add(
            t.path("fallback_topic"),
            f"{json.dumps(fallback)} is a delay topic: a record with no destination would go "
            "round it for ever; name a topic that is not in delay_router.topics",
        )
    if job_name is not None:
        control = {produced_topic(job_name), redriven_topic(job_name)}
        for name in [*delays, fallback]:
            if name in control:
                t.problems.add(
                    t.path("topics" if name in delays else "fallback_topic"),
                    f"{json.dumps(name)} is the job's control topic; choose another topic",
                )
    if not t.ok or None in delays.values() or read_ahead is None or max_ahead is None:
        return None
    return DelayRouterConfig(delays, target, stamp, fallback, read_ahead, max_ahead)


def check_exception_classes(
    problems: Problems, key: str, references: tuple[str, ...], paths: tuple[str, ...]
) -> None:
    """Each of `references` (the list or table at `key`) must import, with the handler's
    paths, as an exception class."""

    def is_exception_class(target: object) -> bool:
        return isinstance(target, type) and issubclass(target, BaseException)

    for i, reference in enumerate(references):
        where = f"{key}[{i}]" if key == "retry.non_retryable" else f"{key}.{reference}"
        _check_import(problems, where, reference, paths, is_exception_class, "an exception class")


def check_callable(problems: Problems, key: str, reference: str, paths: tuple[str, ...]) -> None:
    """`reference` (the value at `key`) must import, with the handler's paths, as a callable."""
    _check_import(problems, key, reference, paths, callable, "callable")
