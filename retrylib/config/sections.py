"""Reading each table of the config file ([job], [kafka], [handler], [output],
[dead_letter], [hooks], [metrics], [breaker]) into its `model` dataclass, checking what lies
within it; [retry] and [delay_router] are read in `delay_sections`.

Each reader returns None when anything it checked was a problem (recorded in `t.problems`).
"""

from __future__ import annotations

import json
import os

from retrylib.config.import_checks import check_import
from retrylib.config.kafka_options import JOB_OWNED_OPTIONS, option_problem
from retrylib.config.locations import check_table_name
from retrylib.config.model import (
    ANY_TOPIC,
    HOOKS,
    TIER_TIMESTAMP_CONFIG,
    BreakerConfig,
    DeadLetterConfig,
    HandlerConfig,
    HooksConfig,
    JobConfig,
    KafkaConfig,
    MetricsConfig,
    NewTopics,
    OutputConfig,
    RetryTier,
)
from retrylib.config.schema import OutputSchema, parse_schema
from retrylib.config.secrets import MASK, is_hidden
from retrylib.config.security import check_security, read_security
from retrylib.config.topics import check_dead_letter_topics
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
    Problems,
    Table,
    instant_ms,
)

# A batch hook that takes longer holds up its batch; past it the batch goes on without it.
DEFAULT_HOOK_TIMEOUT = "30s"
DEFAULT_HANDLER_TIMEOUT = "5m"  # as Kafka's max.poll.interval.ms: a slow call, not a hung one
_MAX_PARALLELISM = 256  # lanes (threads) per Spark task
_DEFAULT_DEAD_LETTER_TOPIC = "{topic}.{job}.dlt"
_PATTERN_DEAD_LETTER_TOPIC = "{job}.dlt"


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
            check_import(t.problems, t.path("function"), function, paths, callable, "callable")
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
