"""Configs that used to load and then fail or misbehave later: refused at load time instead.

Kafka options the job sets itself or librdkafka does not take, a control topic Kafka cannot
hold or that another topic claims, tables inside the checkpoint or inside one another, and
malformed ${...} references. Each problem names the key and the fix.
"""

from __future__ import annotations

import pytest
from helpers import problem_for, write_literal_config

from retrylib.config.kafka_options import option_problem
from retrylib.config.loader import collect_config_errors, load_config

pytestmark = pytest.mark.usefixtures("run_from_repo")


def option(name: str, literal: str) -> str:
    return f'[kafka.options]\n"{name}" = {literal}\n'


# [kafka.options]


@pytest.mark.parametrize(
    ("name", "fix"),
    [
        ("bootstrap.servers", "kafka.bootstrap_servers"),
        ("metadata.broker.list", "kafka.bootstrap_servers"),
        ("group.id", "checkpoint"),
        ("enable.auto.commit", "checkpoint"),
        ("auto.offset.reset", "kafka.starting_offsets"),
        ("transactional.id", "exactly-once"),
        ("enable.idempotence", "idempotent"),
        ("key.deserializer", "handler"),
        ("value.serializer", "handler"),
        ("subscribe", "kafka.topics"),
        ("assign", "kafka.topics"),
        ("startingOffsets", "kafka.starting_offsets"),
        ("startingTimestamp", "kafka.starting_offsets"),
        ("startingOffsetsByTimestamp", "kafka.starting_offsets"),
        ("failOnDataLoss", "kafka.fail_on_data_loss"),
        ("maxOffsetsPerTrigger", "kafka.max_offsets_per_trigger"),
    ],
)
def test_options_the_job_sets_itself_are_refused(tmp_path, name: str, fix: str) -> None:
    problem = problem_for(tmp_path, {}, extra=option(name, '"x"'))
    assert problem.startswith(f"kafka.options.{name}: set by the job itself: ")
    assert fix in problem


def test_bootstrap_servers_in_options_names_the_key_to_use(tmp_path) -> None:
    problem = problem_for(tmp_path, {}, extra=option("bootstrap.servers", '"elsewhere:9092"'))
    assert problem == (
        "kafka.options.bootstrap.servers: set by the job itself: the brokers come from "
        "kafka.bootstrap_servers; set them there"
    )


def test_an_unknown_option_is_refused_without_a_broker(tmp_path) -> None:
    problem = problem_for(tmp_path, {}, extra=option("sasl.mechansim", '"PLAIN"'))
    assert problem.startswith(
        'kafka.options.sasl.mechansim: No such configuration property: "sasl.mechansim"; '
    )
    assert "librdkafka's properties" in problem


def test_a_spark_prefixed_option_names_the_plain_name(tmp_path) -> None:
    problem = problem_for(tmp_path, {}, extra=option("kafka.security.protocol", '"SSL"'))
    assert problem.endswith('drop the "kafka." prefix Spark uses: "security.protocol"')


def test_a_value_librdkafka_refuses_is_reported(tmp_path) -> None:
    problem = problem_for(tmp_path, {}, extra=option("security.protocol", '"sasl_plain"'))
    assert problem == (
        'kafka.options.security.protocol: Invalid value "sasl_plain" for configuration '
        'property "security.protocol"; give a value librdkafka accepts'
    )


def test_a_refused_secret_value_is_not_echoed(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RL_TIMEOUT", "not-a-number-5ecret")
    problem = problem_for(tmp_path, {}, extra=option("socket.timeout.ms", '"${env:RL_TIMEOUT}"'))
    assert problem.startswith("kafka.options.socket.timeout.ms: Invalid value")
    assert "5ecret" not in problem


def test_documented_overrides_are_accepted(tmp_path) -> None:
    extra = (
        "[kafka.options]\n"
        '"client.id" = "orders"\n'
        '"isolation.level" = "read_uncommitted"\n'
        '"security.protocol" = "SASL_SSL"\n'
        '"sasl.mechanism" = "PLAIN"\n'
        '"sasl.username" = "u"\n'
        '"sasl.password" = "p"\n'
        '"linger.ms" = 20\n'
        '"fetch.wait.max.ms" = 50\n'
    )
    assert collect_config_errors(write_literal_config(tmp_path, extra=extra)) == []


@pytest.mark.parametrize(
    ("name", "value", "refused"),
    [
        ("client.id", "x", False),
        ("linger.ms", "5", False),
        ("no.such.property", "1", True),
        ("session.timeout.ms", "abc", True),
    ],
)
def test_option_problem_asks_librdkafka(name: str, value: str, refused: bool) -> None:
    assert (option_problem(name, value) is not None) is refused


# The control topic


def test_a_job_name_too_long_for_its_control_topic_is_refused(tmp_path) -> None:
    name = "j" * 231
    problem = problem_for(tmp_path, {"job.name": f'"{name}"'})
    assert problem == (
        f'job.name: makes the job\'s control topic "_retrylib.{name}.produced", 250 characters '
        "long, and Kafka allows 249; use a name of at most 230 characters"
    )
    assert (
        collect_config_errors(write_literal_config(tmp_path, {"job.name": f'"{name[:230]}"'})) == []
    )


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"kafka.topics": '["_retrylib.orders.produced"]'}, "kafka.topics[0]"),
        ({"dead_letter.topic": '"_retrylib.orders.produced"'}, "dead_letter.topic"),
        (
            {"retry.delays": '["5s"]', "retry.topics": '["_retrylib.orders.produced"]'},
            "retry tier 0 (retry.delays[0])",
        ),
    ],
)
def test_a_topic_equal_to_the_control_topic_is_refused(tmp_path, changes, key) -> None:
    problem = problem_for(tmp_path, changes)
    assert problem == (
        f'{key}: "_retrylib.orders.produced" is the job\'s control topic (where it records '
        "which batches it produced); choose another topic"
    )


def test_a_topic_equal_to_the_redrive_control_topic_is_refused(tmp_path) -> None:
    problem = problem_for(tmp_path, {"dead_letter.topic": '"_retrylib.orders.redriven"'})
    assert problem == (
        'dead_letter.topic: "_retrylib.orders.redriven" is the job\'s control topic (where it '
        "records which redrives it committed); choose another topic"
    )


# Locations


@pytest.mark.parametrize(
    ("changes", "key", "outer"),
    [
        (
            {"output.table": '"{tmp}/checkpoint/out"', "dead_letter.table": '"{tmp}/dlq"'},
            "output.table",
            "job.checkpoint",
        ),
        ({"dead_letter.table": '"{tmp}/out/dlq"'}, "dead_letter.table", "output.table"),
        ({"metrics.table": '"{tmp}/out/_metrics"'}, "metrics.table", "output.table"),
        ({"job.checkpoint": '"{tmp}/out/checkpoint"'}, "job.checkpoint", "output.table"),
        (
            {
                "output.table": '"s3://bucket/jobs/out"',
                "dead_letter.table": '"s3://bucket/jobs/out/dlq/"',
            },
            "dead_letter.table",
            "output.table",
        ),
    ],
)
def test_a_location_inside_another_is_refused(tmp_path, changes, key, outer) -> None:
    problem = problem_for(tmp_path, changes)
    assert problem.startswith(f"{key}: ")
    assert f" is inside {outer} " in problem
    assert problem.endswith(
        "give each table and the checkpoint a location of its own, none inside another"
    )


def test_siblings_with_a_common_prefix_are_not_nested(tmp_path) -> None:
    changes = {"output.table": '"{tmp}/out"', "dead_letter.table": '"{tmp}/out_dead"'}
    assert collect_config_errors(write_literal_config(tmp_path, changes)) == []


def test_catalog_names_are_not_locations(tmp_path) -> None:
    changes = {"output.table": '"sales.orders"', "dead_letter.table": '"sales.orders_dlq"'}
    assert collect_config_errors(write_literal_config(tmp_path, changes)) == []


# ${...}


@pytest.mark.parametrize(
    ("literal", "shown"),
    [
        ('"${env:}"', '"${env:}"'),
        ('"${env:1ABC}"', '"${env:1ABC}"'),
        ('"${ENV_NAME}"', '"${ENV_NAME}"'),
        ('"${env:NAME"', '"${"'),
        ('"pre-${env:HOME}-${env:}"', '"${env:}"'),
    ],
)
def test_a_malformed_reference_is_refused(tmp_path, literal: str, shown: str) -> None:
    problem = problem_for(tmp_path, {"kafka.bootstrap_servers": literal})
    assert problem.startswith(
        f"kafka.bootstrap_servers: {shown} is not a reference to an environment variable; "
        "write ${env:NAME}"
    )


def test_a_well_formed_reference_still_reads_the_environment(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RL_HOST", "broker")
    path = write_literal_config(tmp_path, {"kafka.bootstrap_servers": '"${env:RL_HOST}:9092"'})
    assert load_config(path).kafka.bootstrap_servers == "broker:9092"


# Local folders: looked at when the config loads, before Spark starts or anything is created.


@pytest.mark.parametrize(
    ("key", "setting"),
    [("job.checkpoint", "checkpoint"), ("output.table", "out"), ("dead_letter.table", "dlq")],
)
def test_a_local_location_that_is_a_file_is_refused(tmp_path, key, setting) -> None:
    (tmp_path / "taken").write_text("not a folder")
    problem = problem_for(tmp_path, {key: '"{tmp}/taken"'})
    assert (
        problem
        == f'{key}: "{tmp_path}/taken" is a file; name a folder (it is created when missing)'
    )


def test_a_local_location_under_a_file_cannot_be_created(tmp_path) -> None:
    (tmp_path / "taken").write_text("not a folder")
    problem = problem_for(tmp_path, {"job.checkpoint": '"{tmp}/taken/deeper/checkpoint"'})
    assert problem == (
        f'job.checkpoint: "{tmp_path}/taken/deeper/checkpoint" cannot be created: '
        f'"{tmp_path}/taken" is a file; name another folder'
    )


def test_uris_and_missing_local_folders_are_left_to_spark(tmp_path) -> None:
    changes = {"job.checkpoint": '"{tmp}/not/yet/there"', "output.table": '"file:/x/taken"'}
    assert collect_config_errors(write_literal_config(tmp_path, changes)) == []


def test_handler_parallelism_is_bounded(tmp_path) -> None:
    problem = problem_for(tmp_path, {"handler.parallelism": "100000"})
    assert problem.startswith("handler.parallelism: at most 256: each lane is a thread")
