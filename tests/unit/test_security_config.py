"""[kafka.security]: one login, written for Spark's Java connector and for librdkafka."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import problem_for, write_literal_config

from retrylib.config.client_security import (
    TOKEN_PROVIDER_OPTION,
    TOKEN_PROVIDER_PATHS_OPTION,
    KafkaSecurity,
    java_security,
    librdkafka_security,
)
from retrylib.config.loader import load_config
from retrylib.kafka.clients import client_config, token_callback

pytestmark = pytest.mark.usefixtures("run_from_repo")

SCRAM = KafkaSecurity("SASL_SSL", "SCRAM-SHA-512", "orders-job", "s3cret", "/etc/ca.pem")


def security_toml(**keys: str) -> str:
    return "[kafka.security]\n" + "".join(f"{key} = {value}\n" for key, value in keys.items())


# Written for each client


def test_scram_over_tls_for_librdkafka():
    assert librdkafka_security(SCRAM) == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "orders-job",
        "sasl.password": "s3cret",
        "ssl.ca.location": "/etc/ca.pem",
    }


def test_scram_over_tls_for_the_java_client():
    assert java_security(SCRAM, environ={}) == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="orders-job" password="s3cret";',
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": "/etc/ca.pem",
    }


def test_plain_uses_the_plain_login_module():
    plain = KafkaSecurity("SASL_PLAINTEXT", "PLAIN", "u", "p")
    assert java_security(plain, environ={})["sasl.jaas.config"] == (
        "org.apache.kafka.common.security.plain.PlainLoginModule required "
        'username="u" password="p";'
    )


def test_quotes_and_backslashes_in_a_password_are_escaped_in_the_jaas_line():
    tricky = KafkaSecurity("SASL_PLAINTEXT", "PLAIN", "u", 'a"b\\c;d')
    line = java_security(tricky, environ={})["sasl.jaas.config"]
    assert line.endswith('password="a\\"b\\\\c;d";')


def test_databricks_gets_the_shaded_login_module():
    line = java_security(SCRAM, environ={"DATABRICKS_RUNTIME_VERSION": "17.3"})["sasl.jaas.config"]
    assert line.startswith("kafkashaded.org.apache.kafka.common.security.scram.ScramLoginModule ")


def test_oauthbearer_leaves_the_java_login_to_java_options():
    oauth = KafkaSecurity("SASL_SSL", "OAUTHBEARER", token_provider="tokens:fetch")
    assert java_security(oauth, environ={}) == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "OAUTHBEARER",
    }
    assert librdkafka_security(oauth, ("/code",)) == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "OAUTHBEARER",
        TOKEN_PROVIDER_OPTION: "tokens:fetch",
        TOKEN_PROVIDER_PATHS_OPTION: '["/code"]',
    }


def test_no_security_table_adds_nothing():
    assert librdkafka_security(None) == {} and java_security(None) == {}


def test_describe_names_mechanism_protocol_and_user_never_the_password():
    assert SCRAM.describe() == "SASL SCRAM-SHA-512 over SASL_SSL, user 'orders-job'"
    assert "s3cret" not in repr(SCRAM.describe())


# The token provider reaches librdkafka as oauth_cb, imported where the client is made


def test_token_provider_becomes_oauth_cb(tmp_path: Path):
    (tmp_path / "tokens_for_test.py").write_text(
        "def fetch(config):\n    return 'token-for-' + config, 2000000000.0\n"
    )
    options = {
        "sasl.mechanism": "OAUTHBEARER",
        TOKEN_PROVIDER_OPTION: "tokens_for_test:fetch",
        TOKEN_PROVIDER_PATHS_OPTION: json.dumps([str(tmp_path)]),
    }
    config = client_config("broker:9092", options)
    assert TOKEN_PROVIDER_OPTION not in config and TOKEN_PROVIDER_PATHS_OPTION not in config
    assert config["oauth_cb"]("x") == ("token-for-x", 2000000000.0)


def test_no_token_provider_no_oauth_cb():
    options: dict[str, object] = {"sasl.mechanism": "PLAIN"}
    assert token_callback(options) is None and options == {"sasl.mechanism": "PLAIN"}


# Read from the config, once for both kinds of client


def test_config_gives_each_client_its_own_spelling(tmp_path: Path):
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    path = write_literal_config(
        tmp_path,
        extra=security_toml(
            protocol='"SASL_SSL"',
            mechanism='"SCRAM-SHA-256"',
            username='"job"',
            password='"pw"',
            ca_file=json.dumps(str(ca)),
        )
        + '[kafka.options]\n"client.id" = "orders"\n'
        + '[kafka.java_options]\n"ssl.endpoint.identification.algorithm" = ""\n'
        + '[kafka.librdkafka_options]\n"ssl.endpoint.identification.algorithm" = "none"\n',
    )
    kafka = load_config(path).kafka
    assert kafka.client_options() == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.username": "job",
        "sasl.password": "pw",
        "ssl.ca.location": str(ca),
        "client.id": "orders",
        "ssl.endpoint.identification.algorithm": "none",
    }
    spark = kafka.spark_options()
    assert spark["sasl.jaas.config"].endswith('username="job" password="pw";')
    assert spark["ssl.truststore.location"] == str(ca)
    assert spark["client.id"] == "orders"
    assert spark["ssl.endpoint.identification.algorithm"] == ""
    assert "sasl.password" not in spark


def test_password_and_java_login_are_hidden_when_printed(tmp_path: Path):
    path = write_literal_config(
        tmp_path,
        extra=security_toml(
            protocol='"SASL_PLAINTEXT"', mechanism='"PLAIN"', username='"job"', password='"pw1"'
        )
        + '[kafka.java_options]\n"sasl.jaas.config" = "x required password=pw2;"\n',
    )
    config = load_config(path)
    printed = json.dumps(config.redacted())
    assert "pw1" not in printed and "pw2" not in printed
    assert config.redacted()["kafka"]["security"]["username"] == "job"
    assert "sasl.password" in config.secret_options()


def test_a_user_name_from_the_environment_is_masked_and_never_named(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("RL_KAFKA_USER", "svc-orders")
    path = write_literal_config(
        tmp_path,
        extra=security_toml(
            protocol='"SASL_PLAINTEXT"',
            mechanism='"PLAIN"',
            username='"${env:RL_KAFKA_USER}"',
            password='"pw"',
        ),
    )
    config = load_config(path)
    assert set(config.secret_options()) == {"sasl.username", "sasl.password"}
    assert config.kafka_login() == "SASL PLAIN over SASL_PLAINTEXT"  # no user name


def test_overrides_reach_each_option_table(tmp_path: Path):
    config = load_config(
        write_literal_config(tmp_path),
        overrides={
            "kafka.java_options.sasl.login.class": "x.Y",
            "kafka.librdkafka_options.socket.nagle.disable": True,
        },
    )
    assert dict(config.kafka.java_options) == {"sasl.login.class": "x.Y"}
    assert dict(config.kafka.librdkafka_options) == {"socket.nagle.disable": "true"}


def test_oauthbearer_with_python_source_imports_the_provider(tmp_path: Path):
    path = write_literal_config(
        tmp_path,
        {"kafka.source": '"python"'},
        extra=security_toml(
            protocol='"SASL_SSL"',
            mechanism='"OAUTHBEARER"',
            token_provider='"orders_handlers.handlers:enrich_order"',
        ),
    )
    kafka = load_config(path).kafka
    options = kafka.client_options()
    assert options[TOKEN_PROVIDER_OPTION] == "orders_handlers.handlers:enrich_order"
    assert json.loads(options[TOKEN_PROVIDER_PATHS_OPTION]) == list(load_config(path).handler.paths)


# Refused, naming the key and the fix


def test_sasl_without_a_mechanism(tmp_path: Path):
    problem = problem_for(tmp_path, {}, security_toml(protocol='"SASL_SSL"'))
    assert problem.startswith("kafka.security.mechanism: missing; SASL_SSL logs in with")


def test_scram_without_a_password(tmp_path: Path):
    problem = problem_for(
        tmp_path,
        {},
        security_toml(protocol='"SASL_SSL"', mechanism='"SCRAM-SHA-512"', username='"u"'),
    )
    assert problem == "kafka.security.password: missing; SASL SCRAM-SHA-512 logs in with it"


def test_a_login_without_sasl(tmp_path: Path):
    problem = problem_for(tmp_path, {}, security_toml(protocol='"SSL"', username='"u"'))
    assert problem.startswith('kafka.security.username: only used with SASL; set protocol = "SASL')


def test_an_unknown_mechanism_lists_the_known_ones(tmp_path: Path):
    problem = problem_for(tmp_path, {}, security_toml(protocol='"SASL_SSL"', mechanism='"GSSAPI"'))
    assert problem.startswith('kafka.security.mechanism: expected one of "PLAIN", "SCRAM-SHA-256"')


def test_a_missing_ca_file(tmp_path: Path):
    problem = problem_for(
        tmp_path, {}, security_toml(protocol='"SSL"', ca_file=json.dumps(f"{tmp_path}/none.pem"))
    )
    assert problem.startswith(f'kafka.security.ca_file: no such file "{tmp_path}/none.pem"')


def test_a_ca_file_without_tls(tmp_path: Path):
    problem = problem_for(tmp_path, {}, security_toml(protocol='"PLAINTEXT"', ca_file='"/x.pem"'))
    assert problem.startswith("kafka.security.ca_file: only used with TLS")


def test_a_setting_in_both_security_and_options(tmp_path: Path):
    problem = problem_for(
        tmp_path,
        {},
        security_toml(protocol='"SSL"') + '[kafka.options]\n"security.protocol" = "SSL"\n',
    )
    assert problem.startswith(
        'kafka.options."security.protocol": also set by [kafka.security]; keep one'
    )


def test_oauthbearer_without_a_token_provider(tmp_path: Path):
    problem = problem_for(
        tmp_path,
        {"kafka.source": '"python"'},
        security_toml(protocol='"SASL_SSL"', mechanism='"OAUTHBEARER"'),
    )
    assert problem.startswith("kafka.security.token_provider: missing; OAUTHBEARER needs")


def test_oauthbearer_for_spark_source_needs_a_java_login(tmp_path: Path):
    problem = problem_for(
        tmp_path,
        {},
        security_toml(
            protocol='"SASL_SSL"',
            mechanism='"OAUTHBEARER"',
            token_provider='"orders_handlers.handlers:enrich_order"',
        ),
    )
    assert problem.startswith(
        "kafka.java_options: Spark's Kafka connector (Java) needs its own OAUTHBEARER login"
    )


def test_a_token_provider_that_does_not_import(tmp_path: Path):
    problem = problem_for(
        tmp_path,
        {"kafka.source": '"python"'},
        security_toml(
            protocol='"SASL_SSL"', mechanism='"OAUTHBEARER"', token_provider='"nowhere:fetch"'
        ),
    )
    assert problem.startswith('kafka.security.token_provider: cannot import "nowhere:fetch"')


def test_java_only_options_are_not_checked_against_librdkafka(tmp_path: Path):
    path = write_literal_config(
        tmp_path, extra='[kafka.java_options]\n"sasl.login.callback.handler.class" = "a.B"\n'
    )
    assert load_config(path).kafka.spark_options() == {"sasl.login.callback.handler.class": "a.B"}


def test_java_options_the_job_sets_itself_are_refused(tmp_path: Path):
    problem = problem_for(tmp_path, {}, '[kafka.java_options]\n"bootstrap.servers" = "x:1"\n')
    assert problem.startswith("kafka.java_options.bootstrap.servers: set by the job itself")
