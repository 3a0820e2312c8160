"""Secrets masked where nothing set logging up (Spark's Python workers); py4j quiet about
errors the job reports itself."""

from __future__ import annotations

import io
import logging
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import KafkaException

from retrylib.config.loader import load_config
from retrylib.errors import TableWriteError
from retrylib.kafka.clients import make_consumer
from retrylib.kafka.source_options import parse_source_options
from retrylib.logs import configure_logging

WORKER = """
import logging, sys
from retrylib.kafka.clients import client_config
secret = sys.argv[1]
config = client_config("127.0.0.1:1", {"client.id": secret, "linger.ms": "5"}, {"client.id"})
config["logger"].warning("CONFWARN [%s#consumer-1] [thrd:app]: a librdkafka line", secret)
logging.getLogger("retrylib.kafka.range_reader").warning("reading with client %s", secret)
"""


def test_a_worker_process_masks_its_clients_secret_options():
    secret = "wkr-5ecret-client-id"

    done = subprocess.run(
        [sys.executable, "-c", WORKER, secret], capture_output=True, text=True, timeout=60
    )

    assert done.returncode == 0, done.stderr
    assert "CONFWARN [***#consumer-1] [thrd:app]: a librdkafka line" in done.stderr
    assert "reading with client ***" in done.stderr
    assert secret not in done.stderr


def test_a_refused_client_configuration_does_not_show_a_secret_value():
    secret = "not-a-protocol-but-secret"

    with pytest.raises(KafkaException) as raised:
        make_consumer(
            "127.0.0.1:1", {"security.protocol": secret}, secret_options={"security.protocol"}
        )

    assert "Invalid value" in str(raised.value)
    assert secret not in str(raised.value) and "***" in str(raised.value)


def test_secret_options_name_the_hidden_kafka_options(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("RL_CLIENT", "c-1")
    (tmp_path / "h.py").write_text("def handle(record):\n    return None\n")
    path = tmp_path / "job.toml"
    path.write_text(f"""
[job]
name = "j"
checkpoint = "{tmp_path}/cp"
[kafka]
bootstrap_servers = "127.0.0.1:9092"
topics = ["orders"]
[kafka.options]
"client.id" = "${{env:RL_CLIENT}}"
"sasl.password" = "literal"
"linger.ms" = "5"
[handler]
function = "h:handle"
output_schema = "id STRING"
paths = ["{tmp_path}"]
[output]
table = "{tmp_path}/out"
""")

    assert load_config(path).secret_options() == ("client.id", "sasl.password")


def test_the_source_carries_the_secret_option_names():
    options = parse_source_options(
        {
            "kafka.bootstrap.servers": "b:9092",
            "subscribe": "t",
            "kafka.client.id": "x",
            "retrylib.secretOptions": '["client.id"]',
        }
    )

    assert options.secret_options == ("client.id",)
    assert options.client_options == {"client.id": "x"}


def test_py4j_does_not_repeat_an_error_the_job_reports_itself():
    stream = io.StringIO()
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        configure_logging("INFO", "text")
        root.handlers[0].setStream(stream)
        callbacks = logging.getLogger("py4j.clientserver")
        for error in (TableWriteError("cannot append"), RuntimeError("a bug")):
            try:
                raise error
            except Exception:
                callbacks.exception("There was an exception while executing the Python Proxy")
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)

    text = stream.getvalue()
    assert "RuntimeError: a bug" in text
    assert "TableWriteError" not in text and text.count("Python Proxy") == 1
