"""Secrets masked in client errors and the source's options; py4j quiet about errors the job
reports itself. (A worker process masking its secrets: tests/integration/test_secret_masking.py.)"""

from __future__ import annotations

import io
import logging
from pathlib import Path

import pytest
from confluent_kafka import KafkaException
from helpers import write_noop_job

from retrylib.config.loader import load_config
from retrylib.errors import TableWriteError
from retrylib.kafka.clients import make_consumer
from retrylib.logs import configure_logging
from retrylib.source.options import parse_source_options


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
    options = {"client.id": "${env:RL_CLIENT}", "sasl.password": "literal", "linger.ms": "5"}
    path = write_noop_job(tmp_path, name="j", kafka={"options": options})

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
