"""Secrets from the config never reach a log line or printed text."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import pytest
from helpers import write_noop_job

from retrylib.config.loader import load_config
from retrylib.logs import (
    JsonFormatter,
    RedactingFilter,
    configure_logging,
    redact,
    redact_secrets,
)


@pytest.fixture
def config_file(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("REDACT_TEST_PASSWORD", "pw-61c0ffee")
    monkeypatch.setenv("REDACT_TEST_USER", "svc-user")
    options = {
        "sasl.password": "${env:REDACT_TEST_PASSWORD}",
        "ssl.key.password": "inline-jaas-9d2e",
        "client.id": "user=${env:REDACT_TEST_USER}",
        "linger.ms": "5",
    }
    return write_noop_job(
        tmp_path, name="redacted", job={"checkpoint": f"{tmp_path}/cp"}, kafka={"options": options}
    )


def test_secret_values_are_the_hidden_values_and_env_variables(config_file):
    secrets = load_config(config_file).secret_values()

    assert {"pw-61c0ffee", "inline-jaas-9d2e", "user=svc-user", "svc-user"} <= secrets
    assert "5" not in secrets and "127.0.0.1:9092" not in secrets


def test_log_lines_never_show_a_secret(config_file):
    stream = io.StringIO()
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        configure_logging()
        root.handlers[0].setStream(stream)
        redact_secrets(load_config(config_file).secret_values())
        log = logging.getLogger("retrylib.test")
        log.info("connecting with %s", "pw-61c0ffee")
        log.info("jaas inline-jaas-9d2e and user svc-user")
        try:
            raise RuntimeError("auth failed for pw-61c0ffee")
        except RuntimeError:
            log.exception("failed")
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)

    text = stream.getvalue()
    assert "connecting with ***" in text
    assert "jaas *** and user ***" in text
    assert "RuntimeError: auth failed for ***" in text
    for secret in ("pw-61c0ffee", "inline-jaas-9d2e", "svc-user"):
        assert secret not in text


def test_redact_masks_printed_text(config_file):
    redact_secrets(load_config(config_file).secret_values())

    assert redact('{"password": "pw-61c0ffee"}') == '{"password": "***"}'


def test_longer_secrets_are_masked_before_their_parts():
    secrets = RedactingFilter()
    secrets.add(["abc", "abcdef"])

    assert secrets.redact("x abcdef y abc") == "x *** y ***"


def test_json_lines_carry_metrics_as_an_object():
    formatter = JsonFormatter()
    record = logging.LogRecord(
        "retrylib.metrics", logging.INFO, __file__, 1, json.dumps({"batch_id": 3}), None, None
    )

    line = json.loads(formatter.format(record))

    assert line["logger"] == "retrylib.metrics"
    assert line["metrics"] == {"batch_id": 3}
    assert line["level"] == "INFO" and line["time"].endswith("+00:00")


def test_short_secrets_are_masked_only_where_they_stand_alone():
    secrets = RedactingFilter()
    secrets.add(["x9"])

    assert secrets.redact("job x9x9 uses password=x9;") == "job x9x9 uses password=***;"


def test_secret_values_include_a_variable_an_override_refers_to(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("REDACT_TEST_TOKEN", "tok-0a1b2c")
    path = write_noop_job(tmp_path, name="overridden", job={"checkpoint": f"{tmp_path}/cp"})

    config = load_config(path, overrides={"kafka.options.client.id": "id-${env:REDACT_TEST_TOKEN}"})

    assert {"id-tok-0a1b2c", "tok-0a1b2c"} <= config.secret_values()
    assert config.redacted()["kafka"]["options"]["client.id"] == "***"
