"""The job config: TOML into frozen dataclasses, with every problem named, echoed and fixable."""

from __future__ import annotations

import copy
import json
import pickle
import re
from pathlib import Path

import pytest
from helpers import REPO, problem_for, write_literal_config

from retrylib.config.loader import collect_config_errors, load_config
from retrylib.config.model import Config, NewTopics, RetryTier
from retrylib.config.secrets import is_secret_key
from retrylib.errors import ConfigError

pytestmark = pytest.mark.usefixtures("run_from_repo")


# Valid configs


def test_minimal_config_fills_defaults(tmp_path: Path) -> None:
    config = load_config(write_literal_config(tmp_path))
    assert config.job.name == "orders"
    assert config.job.checkpoint == f"{tmp_path}/checkpoint"
    assert config.job.trigger_ms == 1_000
    assert config.kafka.topics == ("orders",)
    assert config.kafka.starting_offsets == "earliest"
    assert config.kafka.max_offsets_per_trigger is None
    assert config.kafka.source == "auto"
    assert config.kafka.create_topics is True
    assert dict(config.kafka.options) == {}
    assert config.handler.output_schema.names == ("order_id", "total")
    assert config.handler.paths == (str(tmp_path),)  # the config file's folder
    assert config.handler.timeout_ms == 300_000  # 5m
    assert config.retry.delays_ms == (10_000, 60_000, 600_000)
    assert config.retry.max_attempts == 4
    assert config.retry.jitter == 0.0
    assert config.retry.non_retryable == ()
    assert config.retry.tier_topics() == (
        "orders.orders.retry.10s",
        "orders.orders.retry.1m",
        "orders.orders.retry.10m",
    )
    assert config.retry.max_retry_after_ms == 3_600_000
    assert config.retry.read_ahead_ms == 2_000
    assert config.dead_letter.topic == "orders.orders.dlt"
    assert config.dead_letter.table == f"{tmp_path}/out_dead_letter"
    assert config.metrics.table is None
    assert config.metrics.dead_letter_every_ms == 60_000
    assert config.source_path == str(tmp_path / "job.toml")


def test_example_conf_orders_loads() -> None:
    config = load_config(REPO / "conf" / "orders.toml")
    assert config.handler.function == "orders_handlers.handlers:enrich_order"
    assert config.handler.output_schema.ddl == (
        "order_id STRING, customer STRING, total DOUBLE, currency STRING"
    )
    assert config.retry.delays_ms == (5_000, 60_000, 600_000)
    assert config.retry.jitter == pytest.approx(0.1)
    assert config.dead_letter.topic == "orders.orders.dlt"
    assert config.handler.paths == (str(REPO / "examples"),)


def test_full_config(tmp_path: Path) -> None:
    path = tmp_path / "full.toml"
    path.write_text(
        f"""
[job]
name = "orders-v2.1_eu"
checkpoint = "{tmp_path}/cp"
trigger = "500ms"

[kafka]
bootstrap_servers = "k1:9092,k2:9092"
topics = ["orders", "refunds"]
starting_offsets = '{{"orders": {{"0": 12, "1": -2}}, "refunds": {{"0": -1}}}}'
max_offsets_per_trigger = 5000
source = "python"
create_topics = false

[kafka.options]
"client.id" = "orders"
"socket.keepalive.enable" = true
"linger.ms" = 5
"retry.backoff.ms" = 1.5

[handler]
function = "orders_handlers.handlers:enrich_order"
output_schema = "order_id STRING NOT NULL, lines ARRAY<STRUCT<sku: STRING, qty: INT>>"
paths = [".", "examples"]
timeout = "1m30s"

[output]
table = "s3://bucket/orders/out"

[retry]
delays = ["5s", "1.5m"]
max_attempts = 6
jitter = "12.5%"
non_retryable = [
    "ValueError", "retrylib.errors:NonRetryable", "orders_handlers.handlers:TransientLookupError"
]
topic_template = "retry-{{delay}}-{{topic}}"

[dead_letter]
topic = "all.dlt"
table = "s3://bucket/orders/dlq"

[metrics]
table = "s3://bucket/orders/metrics"
"""
    )
    config = load_config(path)
    assert config.job.trigger_ms == 500
    assert config.kafka.topics == ("orders", "refunds")
    assert json.loads(config.kafka.starting_offsets)["orders"] == {"0": 12, "1": -2}
    assert config.kafka.max_offsets_per_trigger == 5000
    assert config.kafka.source == "python"
    assert config.kafka.create_topics is False
    assert dict(config.kafka.options) == {
        "client.id": "orders",
        "socket.keepalive.enable": "true",
        "linger.ms": "5",
        "retry.backoff.ms": "1.5",
    }
    assert config.handler.paths == (str(tmp_path), str(tmp_path / "examples"))
    assert config.handler.timeout_ms == 90_000
    assert config.retry.max_attempts == 6
    assert config.retry.jitter == 0.125
    assert config.retry.tiers == (
        RetryTier(0, 5_000, {"orders": "retry-5s-orders", "refunds": "retry-5s-refunds"}),
        RetryTier(1, 90_000, {"orders": "retry-1m30s-orders", "refunds": "retry-1m30s-refunds"}),
    )
    assert config.retry.tier_topics() == (
        "retry-5s-orders",
        "retry-5s-refunds",
        "retry-1m30s-orders",
        "retry-1m30s-refunds",
    )
    assert config.dead_letter.table == "s3://bucket/orders/dlq"
    assert config.metrics.table == "s3://bucket/orders/metrics"


def test_explicit_retry_topics(tmp_path: Path) -> None:
    config = load_config(
        write_literal_config(
            tmp_path, {"retry.delays": '["5s", "1m"]', "retry.topics": '["o.wait.a", "o.wait.b"]'}
        )
    )
    assert config.retry.tiers == (
        RetryTier(0, 5_000, {"orders": "o.wait.a"}),
        RetryTier(1, 60_000, {"orders": "o.wait.b"}),
    )


def test_config_is_frozen_and_pickles(tmp_path: Path) -> None:
    config = load_config(
        write_literal_config(tmp_path, extra='[kafka.options]\n"client.id" = "x"\n')
    )
    with pytest.raises(AttributeError):
        config.job.name = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        config.kafka.options["client.id"] = "y"  # type: ignore[index]
    with pytest.raises(TypeError):
        config.retry.tiers[0].topics["orders"] = "x"  # type: ignore[index]
    assert pickle.loads(pickle.dumps(config)) == config
    assert copy.deepcopy(config) == config
    assert isinstance(pickle.loads(pickle.dumps(config)), Config)


def test_new_topics_settings_are_read_with_their_configs_as_strings(tmp_path: Path) -> None:
    config = load_config(
        write_literal_config(
            tmp_path,
            {
                "kafka.new_topics": "{ replication_factor = 2, partitions = 6, configs = "
                '{ "retention.ms" = 86400000, "min.insync.replicas" = "2" } }'
            },
        )
    )
    assert config.kafka.new_topics == NewTopics(
        2, 6, {"retention.ms": "86400000", "min.insync.replicas": "2"}
    )
    assert load_config(write_literal_config(tmp_path)).kafka.new_topics == NewTopics()


def test_relative_handler_paths_resolve_from_the_config_files_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "cfg_test_handlers.py").write_text(
        "class Bad(Exception):\n    pass\n\ndef handle(record):\n    return None\n"
    )
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # the job started from another folder
    config = load_config(
        write_literal_config(
            tmp_path,
            {
                "handler.function": '"cfg_test_handlers:handle"',
                "handler.paths": '["code"]',
                "retry.non_retryable": '["cfg_test_handlers:Bad"]',
            },
        )
    )
    assert config.handler.paths == (str(tmp_path / "code"),)


def test_check_imports_false_skips_importing(tmp_path: Path) -> None:
    path = write_literal_config(
        tmp_path,
        {"handler.function": '"no_such_module:f"', "retry.non_retryable": '["nope:Err"]'},
    )
    assert load_config(path, check_imports=False).handler.function == "no_such_module:f"
    assert len(collect_config_errors(path)) == 2


# Problems: each names the key, echoes the value and says the fix.

PROBLEMS = [
    ({"job.name": None}, r'job\.name: missing; add name = "orders" under \[job\]'),
    ({"job.name": '"my job"'}, r"job\.name: expected a name of letters.*, got \"my job\""),
    ({"job.checkpoint": '""'}, r'job\.checkpoint: expected a non-empty string, got ""'),
    ({"job.trigger": '"5x"'}, r'job\.trigger: bad duration "5x": write a number and a unit'),
    ({"job.trigger": "5"}, r"job\.trigger: bad duration 5: write a number and a unit"),
    (
        {"kafka.bootstrap_servers": "9092"},
        r"kafka\.bootstrap_servers: expected a non-empty string, got 9092; write it like "
        r'bootstrap_servers = "127\.0\.0\.1:9092"',
    ),
    ({"kafka.topics": "[]"}, r"kafka\.topics: expected a non-empty list, got \[\]"),
    ({"kafka.topics": '"orders"'}, r'kafka\.topics: expected a non-empty list, got "orders"'),
    (
        {"kafka.topics": '["orders", "bad topic"]'},
        r'kafka\.topics\[1\]: expected a Kafka topic name .*, got "bad topic"',
    ),
    (
        {"kafka.topics": '["orders", "orders"]'},
        r'kafka\.topics\[1\]: "orders" is listed twice; list it once',
    ),
    (
        {"kafka.starting_offsets": '"beginning"'},
        r'kafka\.starting_offsets: expected "earliest", "latest", a date-time .*, got "beginning"',
    ),
    (
        {"kafka.starting_offsets": """'{"orders": {"x": 1}}'"""},
        r"kafka\.starting_offsets: expected .*JSON.*, got",
    ),
    (
        {"kafka.starting_offsets": """'{"other": {"0": 1}}'"""},
        r'kafka\.starting_offsets: names topics \["other"\] that are not in kafka\.topics',
    ),
    (
        {"kafka.max_offsets_per_trigger": "0"},
        r"kafka\.max_offsets_per_trigger: expected a whole number >= 1, got 0",
    ),
    (
        {"kafka.source": '"spark"'},
        r'kafka\.source: expected one of "auto", "builtin", "python", got "spark"',
    ),
    ({"kafka.create_topics": '"yes"'}, r'kafka\.create_topics: expected true or false, got "yes"'),
    ({"kafka.options": '"x"'}, r'kafka\.options: expected a table, got "x"'),
    (
        {"handler.function": '"orders_handlers.handlers.enrich_order"'},
        r'handler\.function: expected a reference like "package\.module:function", got',
    ),
    (
        {"handler.function": '"orders_handlers.handlers:nope"'},
        r'handler\.function: cannot import "orders_handlers\.handlers:nope": AttributeError: .*'
        r"handler\.paths",
    ),
    (
        {"handler.function": '"no_such_module_x:f"'},
        r"handler\.function: cannot import .*No module named 'no_such_module_x'",
    ),
    (
        {"handler.function": '"orders_handlers.handlers:_TEXT_FIELDS"'},
        r'handler\.function: "orders_handlers\.handlers:_TEXT_FIELDS" is not callable, got tuple',
    ),
    (
        {"handler.output_schema": '"a STRNG"'},
        r'handler\.output_schema: bad schema "a STRNG": expected a type .*got \'STRNG\' at '
        r"position 2; write Spark DDL like",
    ),
    ({"handler.paths": '"."'}, r'handler\.paths: expected a non-empty list, got "\."'),
    (
        {"kafka.new_topics": "{ replication_factor = 0 }"},
        r"kafka\.new_topics\.replication_factor: expected a whole number >= 1, got 0",
    ),
    (
        {"kafka.new_topics": '{ configs = { "message.timestamp.after.max.ms" = "1" } }'},
        r"kafka\.new_topics\.configs\.message\.timestamp\.after\.max\.ms: set by the job on "
        r"each retry topic",
    ),
    ({"handler.timeout": '"0s"'}, r'handler\.timeout: expected a duration above zero, got "0s"'),
    ({"output.table": None}, r"output\.table: missing; add table = .* under \[output\]"),
    ({"output": None}, r"output: missing; add a \[output\] table to the file"),
    ({"retry.delays": "[]"}, r"retry\.delays: expected a non-empty list, got \[\]"),
    ({"retry.delays": '["5s", "5x"]'}, r'retry\.delays\[1\]: bad duration "5x"'),
    ({"retry.delays": '["5s", "0ms"]'}, r"retry\.delays\[1\]: expected a duration above zero"),
    (  # durations are whole milliseconds: below half of one is zero
        {"retry.delays": '["0.4ms"]'},
        r'retry\.delays\[0\]: expected a duration above zero, got "0\.4ms"',
    ),
    ({"retry.max_attempts": "0"}, r"retry\.max_attempts: expected a whole number >= 1, got 0"),
    (
        {"retry.max_attempts": "true"},
        r"retry\.max_attempts: expected a whole number >= 1, got true",
    ),
    ({"retry.max_attempts": "1.5"}, r"retry\.max_attempts: expected a whole number >= 1, got 1\.5"),
    ({"retry.jitter": '"120%"'}, r'retry\.jitter: expected a percentage .*, got "120%"'),
    ({"retry.jitter": "0.1"}, r"retry\.jitter: expected a percentage .*, got 0\.1; write it like"),
    (
        {"retry.non_retryable": '["NoSuchError"]'},
        r"retry\.non_retryable\[0\]: cannot import \"NoSuchError\": .*not a builtin",
    ),
    (
        {"retry.non_retryable": '["orders_handlers.handlers:enrich_order"]'},
        r'retry\.non_retryable\[0\]: "orders_handlers\.handlers:enrich_order" is not an '
        r"exception class, got function",
    ),
    (
        {"retry.non_retryable": '["not a name!"]'},
        r'retry\.non_retryable\[0\]: expected a builtin exception name .*, got "not a name!"',
    ),
    (
        {"retry.topics": '["a", "b"]'},
        r"retry\.topics: lists 2 topics for 3 delays; give one topic per entry of retry\.delays",
    ),
    (
        {"kafka.topics": '["orders", "refunds"]', "retry.topics": '["a", "b", "c"]'},
        r"retry\.topics: needs exactly one main topic, but kafka\.topics has 2",
    ),
    (
        {"retry.topics": '["a", "b", "c"]', "retry.topic_template": '"{topic}.{delay}"'},
        r"retry\.topics: set together with retry\.topic_template; keep only one of them",
    ),
    (
        {"retry.topics": '["orders", "b", "c"]'},
        r'retry\.topics\[0\]: "orders" is already used by kafka\.topics\[0\]',
    ),
    (
        {"retry.topic_template": '"{topic}.{bogus}"'},
        r"retry\.topic_template: expected a pattern using only \{topic\} and \{delay\}, got",
    ),
    (
        {"retry.topic_template": '"{topic} retry {delay}"'},
        r'retry\.topic_template: makes topic "orders retry 10s" from .*not a Kafka topic name',
    ),
    (
        {"retry.delays": '["1m"]', "retry.topic_template": '"{topic}"'},
        r'retry\.topic_template \(for "orders" at retry\.delays\[0\]\): "orders" is already used '
        r"by kafka\.topics\[0\]",
    ),
    (
        {"retry.delays": '["1m", "60s"]'},
        r'retry\.topic_template \(for "orders" at retry\.delays\[1\]\): '
        r'"orders\.orders\.retry\.1m" '
        r"is already used by .*retry\.delays\[0\].*distinct delays",
    ),
    (
        {"dead_letter.topic": '"orders"'},
        r'dead_letter\.topic: "orders" is already used by kafka\.topics\[0\]',
    ),
    (
        {"dead_letter.topic": '"orders.orders.retry.1m"'},
        r'dead_letter\.topic: "orders\.orders\.retry\.1m" is already used by retry tier 1',
    ),
    (
        {"dead_letter.table": '"{tmp}/out"'},
        r"dead_letter\.table: .* is already used by output\.table; the checkpoint and each table",
    ),
    (
        {"output.table": '"{tmp}/checkpoint/"'},
        r"output\.table: .* is already used by job\.checkpoint",
    ),
    (
        {"metrics.table": '"{tmp}/out_dead_letter"'},
        r"metrics\.table: .* is already used by dead_letter\.table",
    ),
    (
        {"job.nmae": '"x"'},
        r"job\.nmae: unknown key; did you mean 'name'\? valid keys here are checkpoint, name, "
        r"stop_timeout, trigger",
    ),
    ({"retries.delays": '["5s"]'}, r"retries: unknown key; did you mean 'retry'\? valid keys"),
    ({"retry.read_ahead": '"2m"'}, r"retry\.read_ahead: at most 1m: a record read ahead holds"),
    ({"retry.read_ahead": '"-1s"'}, r"retry\.read_ahead: bad duration"),
    ({"metrics.tabel": '"x"'}, r"metrics\.tabel: unknown key; did you mean 'table'\?"),
    ({"metrics.dead_letter_every": '"often"'}, r"metrics\.dead_letter_every: bad duration"),
]


@pytest.mark.parametrize(("changes", "pattern"), PROBLEMS)
def test_problem_names_key_value_and_fix(
    tmp_path: Path, changes: dict[str, str | None], pattern: str
) -> None:
    assert re.search(pattern, problem_for(tmp_path, changes))


def test_option_values_must_be_scalars_and_dotted_names_quoted(tmp_path: Path) -> None:
    problem = problem_for(tmp_path, {}, extra='[kafka.options]\nsasl.mechanism = "PLAIN"\n')
    assert problem.startswith('kafka.options.sasl: expected a string, number or boolean, got {"')
    assert "quote names that hold dots" in problem


def test_error_message_lists_every_problem_one_per_line(tmp_path: Path) -> None:
    path = write_literal_config(
        tmp_path,
        {
            "job.name": None,
            "job.trigger": '"soon"',
            "kafka.topics": '["orders", "orders"]',
            "handler.output_schema": '"a"',
            "retry.jitter": '"200%"',
            "retry.max_attempts": "-1",
            "dead_letter.colour": '"red"',
        },
    )
    problems = collect_config_errors(path)
    assert [p.split(":")[0] for p in problems] == [
        "job.name",
        "job.trigger",
        "kafka.topics[1]",
        "handler.output_schema",
        "retry.max_attempts",
        "retry.jitter",
        "dead_letter.colour",
    ]
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    message = str(raised.value)
    assert message.splitlines() == [f"invalid config {path} (7 problems):", *problems]
    assert raised.value.problems == tuple(problems)  # type: ignore[attr-defined]


def test_valid_config_has_no_problems(tmp_path: Path) -> None:
    assert collect_config_errors(write_literal_config(tmp_path)) == []


def test_table_of_wrong_type(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text('job = "orders"\n')
    problems = collect_config_errors(path)
    assert problems[0] == 'job: expected a table, got "orders"; write it like a [job] table'
    assert "kafka: missing; add a [kafka] table to the file" in problems


def test_invalid_toml_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text('[job]\nname = "orders\n')
    with pytest.raises(ConfigError, match=rf"{re.escape(str(path))}: not valid TOML: .*line 2"):
        load_config(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.toml: no such file; pass the path"):
        load_config(tmp_path / "nope.toml")


# ${env:NAME}, redaction and overrides


def test_env_references_are_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RL_BROKERS", "broker:9093")
    monkeypatch.setenv("RL_USER", "svc")
    monkeypatch.setenv("RL_PASSWORD", "hunter2")
    path = write_literal_config(
        tmp_path,
        {"kafka.bootstrap_servers": '"${env:RL_BROKERS}"', "kafka.topics": '["${env:RL_USER}-in"]'},
        extra=(
            "[kafka.options]\n"
            '"sasl.oauthbearer.config" = "principal=${env:RL_USER} secret=${env:RL_PASSWORD}"\n'
        ),
    )
    config = load_config(path)
    assert config.kafka.bootstrap_servers == "broker:9093"
    assert config.kafka.topics == ("svc-in",)
    assert config.kafka.options["sasl.oauthbearer.config"] == "principal=svc secret=hunter2"
    assert config.from_env == {
        "kafka.bootstrap_servers",
        "kafka.topics[0]",
        "kafka.options.sasl.oauthbearer.config",
    }


def test_unset_env_variable_is_one_problem_naming_key_and_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RL_MISSING", raising=False)
    path = write_literal_config(
        tmp_path, {"kafka.topics": '["${env:RL_MISSING}"]', "retry.jitter": '"x"'}
    )
    problems = collect_config_errors(path)
    assert problems[0] == (
        "kafka.topics[0]: environment variable RL_MISSING is not set (the value is "
        '"${env:RL_MISSING}"); export RL_MISSING before starting the job'
    )
    # The unexpanded value is not also reported as a bad topic name; other problems still are.
    assert [p.split(":")[0] for p in problems] == ["kafka.topics[0]", "retry.jitter"]


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("sasl.password", True),
        ("sasl.jaas.config", True),
        ("ssl.key.password", True),
        ("ssl.keystore.password", True),
        ("basic.auth.user.info", True),
        ("sasl.oauthbearer.client.secret", True),
        ("sasl.oauthbearer.config", True),
        ("ssl.key.pem", True),
        ("api_token", True),
        ("SASL.PASSWORD", True),
        ("client.id", False),
        ("bootstrap.servers", False),
        ("sasl.mechanism", False),
        ("sasl.username", False),
        ("security.protocol", False),
        ("ssl.ca.location", False),
    ],
)
def test_is_secret_key(name: str, secret: bool) -> None:
    assert is_secret_key(name) is secret


def test_redacted_hides_secret_options_and_env_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RL_BROKERS", "internal-broker:9093")
    path = write_literal_config(
        tmp_path,
        {"kafka.bootstrap_servers": '"${env:RL_BROKERS}"'},
        extra=(
            "[kafka.options]\n"
            '"client.id" = "orders"\n'
            '"sasl.password" = "hunter2"\n'
            '"sasl.oauthbearer.client.secret" = "u:p"\n'
        ),
    )
    redacted = load_config(path).redacted()
    assert redacted["kafka"]["bootstrap_servers"] == "***"
    assert redacted["kafka"]["options"] == {
        "client.id": "orders",
        "sasl.password": "***",
        "sasl.oauthbearer.client.secret": "***",
    }
    assert redacted["job"] == {
        "name": "orders",
        "checkpoint": f"{tmp_path}/checkpoint",
        "trigger_ms": 1_000,
        "stop_timeout_ms": 120_000,
    }
    assert redacted["handler"]["output_schema"] == "order_id STRING, total DOUBLE"
    assert redacted["retry"]["tiers"][0] == {
        "index": 0,
        "delay_ms": 10_000,
        "topics": {"orders": "orders.orders.retry.10s"},
    }
    text = json.dumps(redacted)
    assert "hunter2" not in text and "internal-broker" not in text and "u:p" not in text


def test_problem_messages_never_echo_secrets(tmp_path: Path) -> None:
    problem = problem_for(tmp_path, {}, extra='[kafka.options]\n"sasl.password" = ["hunter2"]\n')
    assert problem.startswith("kafka.options.sasl.password: expected a string, number or boolean")
    assert "hunter2" not in problem and '"***"' in problem


def test_overrides_apply_before_validation(tmp_path: Path) -> None:
    config = load_config(
        write_literal_config(tmp_path),
        overrides={
            "kafka.bootstrap_servers": "127.0.0.1:5555",
            "kafka.options.sasl.mechanism": "PLAIN",
            "job.checkpoint": tmp_path / "cp2",
            "retry.delays": ["1s"],
            "metrics.table": str(tmp_path / "metrics"),
        },
    )
    assert config.kafka.bootstrap_servers == "127.0.0.1:5555"
    assert dict(config.kafka.options) == {"sasl.mechanism": "PLAIN"}
    assert config.job.checkpoint == str(tmp_path / "cp2")
    assert config.retry.tier_topics() == ("orders.orders.retry.1s",)
    assert config.metrics.table == str(tmp_path / "metrics")


def test_bad_override_is_reported_like_a_bad_file_value(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"retry\.max_attempts: expected a whole number >= 1, got 0"
    ):
        load_config(write_literal_config(tmp_path), overrides={"retry.max_attempts": 0})


def test_override_through_a_non_table(tmp_path: Path) -> None:
    problems = collect_config_errors(write_literal_config(tmp_path), overrides={"job.name.x": 1})
    assert problems == ["overrides['job.name.x']: job.name is not a table; override job.name"]


def test_overrides_can_supply_missing_keys(tmp_path: Path) -> None:
    path = write_literal_config(tmp_path, {"kafka.bootstrap_servers": None})
    assert "kafka.bootstrap_servers: missing" in collect_config_errors(path)[0]
    config = load_config(path, overrides={"kafka.bootstrap_servers": "b:1"})
    assert config.kafka.bootstrap_servers == "b:1"


def test_several_unset_env_variables_in_one_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RL_A", raising=False)
    monkeypatch.delenv("RL_B", raising=False)
    path = write_literal_config(tmp_path, {"kafka.bootstrap_servers": '"${env:RL_A}:${env:RL_B}"'})
    assert collect_config_errors(path) == [
        "kafka.bootstrap_servers: environment variables RL_A and RL_B are not set (the value is "
        '"${env:RL_A}:${env:RL_B}"); export RL_A and RL_B before starting the job'
    ]


# Delta tables: paths or catalog names, and what the job does when it creates the output


def test_output_table_settings(tmp_path: Path) -> None:
    config = load_config(
        write_literal_config(
            tmp_path,
            {
                "output.table": '"main.sales.orders"',
                "output.partition_by": '["order_id"]',
                "output.schema_evolution": "true",
            },
            extra='[output.properties]\n"delta.appendOnly" = true\n',
        )
    )
    assert config.output.table == "main.sales.orders"
    assert config.output.partition_by == ("order_id",)
    assert dict(config.output.properties) == {"delta.appendOnly": "true"}
    assert config.output.schema_evolution is True
    assert config.dead_letter.table == "main.sales.orders_dead_letter"


def test_output_defaults_create_a_plain_table(tmp_path: Path) -> None:
    output = load_config(write_literal_config(tmp_path)).output
    assert (output.partition_by, dict(output.properties), output.schema_evolution) == (
        (),
        {},
        False,
    )
    assert output.optimize_every_ms is None  # no scheduled compaction unless asked


def test_optimize_every_is_read_in_milliseconds(tmp_path: Path) -> None:
    config = load_config(write_literal_config(tmp_path, {"output.optimize_every": '"1h30m"'}))
    assert config.output.optimize_every_ms == 5_400_000


def test_a_read_ahead_of_zero_reads_only_what_is_due(tmp_path: Path) -> None:
    config = load_config(write_literal_config(tmp_path, {"retry.read_ahead": '"0s"'}))
    assert config.retry.read_ahead_ms == 0


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ('"30"', r'output\.optimize_every: bad duration "30": write a number and a unit'),
        ('"0s"', r'output\.optimize_every: expected a duration above zero, got "0s"'),
        ("30", r"output\.optimize_every: bad duration 30: write a number and a unit"),
    ],
)
def test_a_bad_optimize_every_is_named_with_the_fix(tmp_path: Path, value, says) -> None:
    assert re.match(says, problem_for(tmp_path, {"output.optimize_every": value}))


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("output.table", '"orders"', "write ./orders for a folder, or db.orders"),
        ("dead_letter.table", '"a.b.c.d"', "has 4 dot-separated parts"),
        ("metrics.table", '"my-db.t"', "backquote other parts"),
    ],
)
def test_a_table_name_that_is_neither_path_nor_catalog_name(tmp_path, key, value, says) -> None:
    problem = problem_for(tmp_path, {key: value})
    assert problem.startswith(f"{key}: ")
    assert says in problem


def test_partition_column_must_be_an_output_column(tmp_path: Path) -> None:
    problem = problem_for(tmp_path, {"output.partition_by": '["day"]'})
    assert problem.startswith("output.partition_by[0]: 'day' is not a column")
    assert "['order_id', 'total']" in problem


# Routing rules: dead-letter topics per exception class, a total retry timeout


def test_dead_letter_routes_and_retry_timeout(tmp_path: Path) -> None:
    extra = (
        '\n[dead_letter.routes]\n"KeyError" = "orders.missing.dlt"\n'
        '"ValueError" = "orders.invalid.dlt"\n"LookupError" = "orders.missing.dlt"\n'
    )
    config = load_config(write_literal_config(tmp_path, {"retry.timeout": '"90s"'}, extra))
    assert config.dead_letter.routes == (
        ("KeyError", "orders.missing.dlt"),
        ("ValueError", "orders.invalid.dlt"),
        ("LookupError", "orders.missing.dlt"),
    )
    assert config.dead_letter.topics() == (
        "orders.orders.dlt",
        "orders.missing.dlt",
        "orders.invalid.dlt",
    )
    assert config.retry.timeout_ms == 90_000
    assert load_config(write_literal_config(tmp_path)).retry.timeout_ms is None


@pytest.mark.parametrize(
    ("route", "pattern"),
    [
        ('"ValueError" = "bad topic"', r"dead_letter\.routes\.ValueError: expected a Kafka topic"),
        ('"no such" = "x.dlt"', r"dead_letter\.routes\.no such: expected a builtin exception name"),
        ('"NoSuchError" = "x.dlt"', r"dead_letter\.routes\.NoSuchError: .*NoSuchError"),
        ('"json:dumps" = "x.dlt"', r"dead_letter\.routes\.json:dumps: .*an exception class"),
        (
            '"KeyError" = "orders"',
            r'dead_letter\.routes\.KeyError: "orders" is already used by kafka',
        ),
    ],
)
def test_bad_dead_letter_routes_name_the_route(tmp_path: Path, route: str, pattern: str) -> None:
    assert re.search(pattern, problem_for(tmp_path, {}, f"\n[dead_letter.routes]\n{route}\n"))


def test_bad_retry_timeout_names_the_key(tmp_path: Path) -> None:
    problem = problem_for(tmp_path, {"retry.timeout": '"0s"'})
    assert problem.startswith("retry.timeout: expected a duration above zero")
