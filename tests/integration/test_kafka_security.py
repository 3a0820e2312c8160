"""One [kafka.security] login through every Kafka client of the job, on a broker that
requires SASL: Spark's Java connector (main topics), the tier source, the producers, the
admin client, `status` and `redrive`; and a wrong password refused at start, by name.

The broker is an embedded Apache Kafka with a SASL_PLAINTEXT listener (PLAIN, SCRAM and
unsigned OAUTHBEARER tokens); the tests set up topics and records on its plaintext one.
The commands run in the test's process, on the tests' Spark session (a refused login also
as a process of its own, as a user meets it).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from chispa import assert_df_equality
from helpers import produce, read_topic, run_cli_completed, run_retrylib, write_job_toml

from retrylib.dev.broker import EmbeddedBroker
from retrylib.kafka.clients import ensure_topics, make_admin
from retrylib.ops.cli import main

HANDLERS_DIR = Path(__file__).parent / "handlers"
USER = "orders-job"  # also the subject of sasl_tokens.unsecured_token
PASSWORD = f"pw-{uuid.uuid4().hex}"
PASSWORD_VARIABLE = "RETRYLIB_TEST_SASL_PASSWORD"
OUTPUT_SCHEMA = "key STRING, value STRING, topic STRING, partition INT, offset BIGINT, attempt INT"
RECORDS = [("ok-0", "a"), ("ok-1", "b"), ("flaky1-0", "c"), ("bad-0", "d")]


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    started = EmbeddedBroker(
        data_dir=tmp_path_factory.mktemp("sasl-broker"), sasl_users={USER: PASSWORD}
    ).start()
    yield started
    started.close()


@pytest.fixture
def topic(broker) -> str:
    name = f"secure-{uuid.uuid4().hex[:8]}"
    ensure_topics(make_admin(broker.bootstrap_servers, {}), {name: 2}, create=True)
    produce(broker.bootstrap_servers, name, RECORDS, partitions=2)
    return name


def secure_job(tmp_path: Path, broker, topic: str, security: dict, **kafka) -> Path:
    return write_job_toml(
        tmp_path / "secure.toml",
        topics=[topic],
        name="secure",
        bootstrap_servers=servers_for(broker, security["protocol"]),
        kafka={"security": security, **kafka},
        handler={
            "function": "job_handlers:by_key",
            "output_schema": OUTPUT_SCHEMA,
            "paths": [HANDLERS_DIR],
        },
        retry={"delays": ["1s"], "max_attempts": 3, "non_retryable": ["ValueError"]},
        dead_letter={"topic": f"{topic}.dlt", "table": f"{tmp_path}/dlq"},
    )


def servers_for(broker, protocol: str) -> str:
    """The broker's listener for `protocol`."""
    if protocol == "SASL_SSL":
        return broker.sasl_ssl_bootstrap_servers
    return broker.sasl_bootstrap_servers


def login(broker, mechanism: str, protocol: str) -> dict:
    """[kafka.security] for `mechanism` over `protocol`, trusting the broker's certificate."""
    security = {
        "protocol": protocol,
        "mechanism": mechanism,
        "username": USER,
        "password": f"${{env:{PASSWORD_VARIABLE}}}",
    }
    if protocol == "SASL_SSL":
        security["ca_file"] = str(broker.ca_file)
    return security


# PLAIN in the clear; SCRAM over TLS.
LOGINS = [("PLAIN", "SASL_PLAINTEXT"), ("SCRAM-SHA-512", "SASL_SSL")]


def retrylib(*args: str, password: str = PASSWORD) -> subprocess.CompletedProcess[str]:
    """`retrylib ARGS` as a user runs it, in a process of its own."""
    return run_retrylib(*args, env={PASSWORD_VARIABLE: password})


def retrylib_here(
    capfd, monkeypatch, *args: str, password: str = PASSWORD
) -> subprocess.CompletedProcess[str]:
    """`retrylib ARGS` in this process (`run_cli_completed`), the login's password in its
    environment variable."""
    monkeypatch.setenv(PASSWORD_VARIABLE, password)
    return run_cli_completed(capfd, *args)


def assert_settled(spark, path: Path, topic: str) -> None:
    """Every record handled: the good ones (one after a retry) in the output table, the
    bad one dead-lettered."""
    workdir = path.parent
    output = spark.read.format("delta").load(str(workdir / "out")).select("key", "attempt")
    expected = spark.createDataFrame([("ok-0", 0), ("ok-1", 0), ("flaky1-0", 1)], output.schema)
    assert_df_equality(output, expected, ignore_row_order=True)
    dead = (
        spark.read.format("delta")
        .load(str(workdir / "dlq"))
        .selectExpr("CAST(key AS STRING) AS key", "origin_topic")
    )
    assert_df_equality(
        dead, spark.createDataFrame([("bad-0", topic)], dead.schema), ignore_row_order=True
    )


def test_a_plain_login_reaches_the_clients_of_a_run(
    spark, broker, topic, tmp_path, capfd, monkeypatch
):
    """PLAIN in the clear, one run: Spark's Java connector, the admin client and the
    executors' producers and marker readers log in. The tier source, `status` and `redrive`
    log in the same way in the SCRAM test below (one translation of [kafka.security] serves
    every mechanism)."""
    path = secure_job(
        tmp_path, broker, topic, login(broker, "PLAIN", "SASL_PLAINTEXT"), source="builtin"
    )

    done = retrylib_here(capfd, monkeypatch, "run", str(path), "--available-now")

    assert done.returncode == 0, done.stderr[-3000:]
    assert PASSWORD not in done.stdout + done.stderr
    output = spark.read.format("delta").load(str(tmp_path / "out")).select("key", "attempt")
    expected = spark.createDataFrame([("ok-0", 0), ("ok-1", 0)], output.schema)
    assert_df_equality(output, expected, ignore_row_order=True)
    dead = spark.read.format("delta").load(str(tmp_path / "dlq"))
    assert [row.key for row in dead.selectExpr("CAST(key AS STRING) AS key").collect()] == ["bad-0"]


def test_one_login_reaches_every_client(spark, broker, topic, tmp_path, capfd, monkeypatch):
    """SCRAM over TLS, so the CA file reaches both kinds of client too."""
    path = secure_job(
        tmp_path, broker, topic, login(broker, "SCRAM-SHA-512", "SASL_SSL"), source="builtin"
    )

    first = retrylib_here(capfd, monkeypatch, "run", str(path), "--available-now")
    time.sleep(1.5)  # the flaky record's retry (1s tier) is due after this
    second = retrylib_here(capfd, monkeypatch, "run", str(path), "--available-now")
    status = retrylib_here(capfd, monkeypatch, "status", str(path), "--json")

    for done in (first, second, status):
        assert done.returncode == 0, done.stderr[-3000:]
        assert PASSWORD not in done.stdout + done.stderr
    assert_settled(spark, path, topic)
    report = json.loads(status.stdout)
    assert report["broker"]["reachable"] is True
    assert report["dead_letters"]["total"] == 1
    dead_id = spark.read.format("delta").load(str(tmp_path / "dlq")).first()["id"]

    redrive = retrylib_here(capfd, monkeypatch, "redrive", str(path), "--id", dead_id, "--json")

    assert redrive.returncode == 0, redrive.stderr[-3000:]
    assert json.loads(redrive.stdout)["sent"] == 1
    keys = [m.key() for m in read_topic(broker.bootstrap_servers, topic)]
    assert keys.count(b"bad-0") == 2  # the original and the redriven copy


@pytest.mark.parametrize(("mechanism", "protocol"), LOGINS)
def test_a_wrong_password_stops_the_job_at_start_naming_brokers_and_mechanism(
    broker, topic, tmp_path, mechanism, protocol, capfd, monkeypatch
):
    security = login(broker, mechanism, protocol)
    path = secure_job(tmp_path, broker, topic, security)
    wrong = f"wrong-{uuid.uuid4().hex}"

    done = retrylib("run", str(path), password=wrong)

    assert done.returncode == 1
    assert (
        f"error: the Kafka brokers at {servers_for(broker, protocol)} refused the login "
        f"(SASL {mechanism} over {protocol}, user '{USER}')" in done.stderr
    )
    assert wrong not in done.stdout + done.stderr
    assert not (tmp_path / "out").exists()
    refused = (
        f"the Kafka brokers at {servers_for(broker, protocol)} refused the login "
        f"(SASL {mechanism} over {protocol}, user '{USER}')"
    )
    checked = retrylib_here(capfd, monkeypatch, "check", str(path), password=wrong)
    assert checked.returncode != 0
    assert f"error: {refused}" in checked.stderr, checked.stderr
    status = retrylib_here(capfd, monkeypatch, "status", str(path), "--json", password=wrong)
    assert refused in json.loads(status.stdout)["broker"]["error"], status.stdout
    assert wrong not in checked.stdout + checked.stderr + status.stdout + status.stderr


def test_a_broker_certificate_without_its_ca_stops_the_job_at_start(broker, topic, tmp_path):
    security = login(broker, "SCRAM-SHA-512", "SASL_SSL")
    del security["ca_file"]  # the system's CAs do not know the broker's self-signed one
    path = secure_job(tmp_path, broker, topic, security)

    done = retrylib("run", str(path))

    assert done.returncode == 1
    assert (
        f"error: the Kafka brokers at {broker.sasl_ssl_bootstrap_servers} failed the TLS "
        "handshake (SASL SCRAM-SHA-512 over SASL_SSL" in done.stderr
    )


def test_oauthbearer_token_provider_logs_in_every_process(spark, broker, topic, tmp_path):
    """On the python source, whose Python workers read the main topic too; the Java
    connector's login here is Kafka's own module, given in `java_options`."""
    calls = tmp_path / "token-calls"
    security = {
        "protocol": "SASL_PLAINTEXT",
        "mechanism": "OAUTHBEARER",
        "token_provider": "sasl_tokens:unsecured_token",
    }
    # The Java connector's own login: Kafka's unsigned-token module, for this broker only.
    java = {
        "sasl.jaas.config": "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
        f' required unsecuredLoginStringClaim_sub="{USER}";'
    }
    path = secure_job(
        tmp_path,
        broker,
        topic,
        security,
        source="python",
        java_options=java,
        librdkafka_options={"sasl.oauthbearer.config": f"calls={calls}"},
    )

    assert main(["run", str(path), "--available-now"]) == 0
    time.sleep(1.5)
    assert main(["run", str(path), "--available-now"]) == 0

    assert_settled(spark, path, topic)
    processes = set(calls.read_text().split())
    assert str(os.getpid()) in processes  # the driver's clients
    assert len(processes) >= 2  # and those of Spark's Python workers
