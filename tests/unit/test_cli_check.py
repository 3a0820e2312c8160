"""`retrylib check` without a broker: every config problem at once, and what it says and
exits with when the broker does not answer. No test here opens a socket: the broker's
look-ups fail as against a closed port (the real closed port, and the command as a process
of its own: tests/integration/test_check_command.py)."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from helpers import REPO, write_noop_job

from retrylib.kafka.reading import KafkaOffsets
from retrylib.ops.check import single_copy_findings
from retrylib.ops.cli import EXIT_CONFIG, EXIT_FAILED, EXIT_OK, main

pytestmark = pytest.mark.usefixtures("keep_root_logger")


@pytest.fixture(autouse=True)
def closed_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kafka look-ups fail at once, as librdkafka's do against a closed port, and no client
    is made."""

    def refused(self: KafkaOffsets, topics: Any, pattern: Any = None) -> dict[str, list[int]]:
        raise KafkaException(KafkaError(KafkaError._TRANSPORT, "Connection refused"))

    monkeypatch.setattr(KafkaOffsets, "__init__", lambda self, *args, **kwargs: None)
    monkeypatch.setattr(KafkaOffsets, "partitions", refused)
    monkeypatch.setattr(KafkaOffsets, "serve_errors", lambda self: None)


def write(tmp_path: Path, **sections: Any) -> Path:
    """Job "checked" on topic "orders" of an unreachable broker, changed by `sections`."""
    return write_noop_job(tmp_path, name="checked", bootstrap_servers="127.0.0.1:1", **sections)


def test_every_config_problem_is_listed_with_its_key(tmp_path, capsys):
    path = write(
        tmp_path,
        job={"name": "bad name!"},
        kafka={"topcs": 1},
        retry={"delays": ["5s", "soon"], "max_attempts": 0},
    )

    code = main(["check", str(path)])

    err = capsys.readouterr().err
    assert code == EXIT_CONFIG
    for key in ("job.name", "kafka.topcs", "retry.delays[1]", "retry.max_attempts"):
        assert f"error: {key}: " in err
    assert "invalid config (4 problems)" in err


def test_an_unreachable_broker_is_a_warning(tmp_path, capsys):
    path = write(tmp_path)

    code = main(["check", str(path), "--timeout", "1"])

    captured = capsys.readouterr()
    assert code == EXIT_OK
    assert "warning: broker 127.0.0.1:1 not reachable within 1s" in captured.err
    assert "topics not checked" in captured.err
    assert captured.out.rstrip().endswith("ok (broker not checked)")


def test_an_unreachable_broker_fails_when_required(tmp_path, capsys):
    path = write(tmp_path)

    code = main(["check", str(path), "--timeout", "1", "--require-broker"])

    assert code == EXIT_FAILED
    assert "--require-broker" in capsys.readouterr().err


def test_show_prints_the_config_with_secrets_masked(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CHECK_TEST_TOKEN", "tok-7f3a9")
    options = {"sasl.oauthbearer.config": "x=${env:CHECK_TEST_TOKEN}", "client.id": "visible"}
    path = write(tmp_path, kafka={"options": options})

    code = main(["check", str(path), "--timeout", "1", "--show"])

    captured = capsys.readouterr()
    assert code == EXIT_OK
    assert '"client.id": "visible"' in captured.out
    assert '"sasl.oauthbearer.config": "***"' in captured.out
    assert "tok-7f3a9" not in captured.out + captured.err


def test_tables_are_not_checked_without_the_flag(tmp_path, capsys, monkeypatch):
    import retrylib.ops.check as check_module

    def no_spark(app_name):
        raise AssertionError("check started Spark without --tables")

    monkeypatch.setattr(check_module, "tool_session", no_spark)
    path = write(tmp_path)

    code = main(["check", str(path), "--timeout", "1"])

    assert code == EXIT_OK
    assert "note: tables not checked (--tables checks them with Spark)" in capsys.readouterr().out


def test_tables_flag_reports_the_table_findings(tmp_path, capsys, monkeypatch):
    import retrylib.ops.check as check_module
    from retrylib.ops.check import Finding

    sessions = []
    monkeypatch.setattr(check_module, "tool_session", lambda name: sessions.append(name) or name)
    monkeypatch.setattr(
        check_module,
        "_table_findings",
        lambda spark, config: [Finding("error", f"output.table: differs (read with {spark})")],
    )
    path = write(tmp_path)

    code = main(["check", str(path), "--timeout", "1", "--tables"])

    err = capsys.readouterr().err
    assert code == EXIT_FAILED
    assert sessions == ["retrylib-check-checked"]
    assert "error: output.table: differs (read with retrylib-check-checked)" in err


def test_an_unknown_kafka_option_is_a_config_error_naming_it(tmp_path, capsys):
    path = write(tmp_path, kafka={"options": {"sasl.mechansim": "PLAIN"}})

    code = main(["check", str(path), "--timeout", "1"])

    err = capsys.readouterr().err
    assert code == EXIT_CONFIG
    assert (
        'error: kafka.options.sasl.mechansim: No such configuration property: "sasl.mechansim"'
        in err
    )
    assert "is the broker up?" not in err


def test_bootstrap_servers_in_kafka_options_is_a_config_error(tmp_path, capsys):
    path = write(tmp_path, kafka={"options": {"bootstrap.servers": "other:9092"}})

    code = main(["check", str(path), "--timeout", "1"])

    assert code == EXIT_CONFIG
    assert (
        "error: kafka.options.bootstrap.servers: set by the job itself" in capsys.readouterr().err
    )


def test_status_warns_of_a_tier_whose_records_are_long_overdue() -> None:
    from retrylib.ops.render import overdue_tiers

    def tier(due_in: float | None) -> dict:
        return {"tier": 1, "delay": "10s", "delay_seconds": 10.0, "next_due_in_seconds": due_in}

    assert overdue_tiers([tier(None), tier(5.0), tier(-60.0)]) == []
    [warning] = overdue_tiers([tier(-3600.0)])
    assert warning.startswith("tier 1 (10s) has records due for 1h that the job has not taken")


def test_check_imports_the_hooks_and_names_the_broken_one(tmp_path, capsys):
    good = write(tmp_path, hooks={"on_batch_end": "h:handle", "on_retry": "h:handle"})

    assert main(["check", str(good)]) == EXIT_OK  # broker not checked: it does not answer
    assert "hooks import: on_retry = h:handle, on_batch_end = h:handle" in capsys.readouterr().out

    bad = write(tmp_path, hooks={"on_dead_letter": "h:no_such_function"})
    assert main(["check", str(bad)]) == EXIT_CONFIG
    assert "error: hooks.on_dead_letter: cannot import" in capsys.readouterr().err


def test_check_says_how_many_lanes_a_task_runs(tmp_path, capsys):
    path = write(tmp_path, handler={"parallelism": 6})

    assert main(["check", str(path)]) == EXIT_OK
    assert "handler: 6 lanes per Spark task (handler.parallelism)" in capsys.readouterr().out


def test_check_says_when_retries_keep_key_order(tmp_path, capsys):
    path = write(tmp_path, kafka={"source": "python"}, retry={"key_ordered": True})

    assert main(["check", str(path)]) == EXIT_OK
    assert "retry: key-ordered (retry.key_ordered)" in capsys.readouterr().out


def test_check_describes_the_breaker(tmp_path, capsys):
    path = write(tmp_path, kafka={"source": "python"}, breaker={"probe_every": "1m"})

    assert main(["check", str(path)]) == EXIT_OK
    assert (
        "breaker: opens when 50% of the last 1000 main-topic records failed, then holds the "
        "main topics (retry tiers go on) and lets 10 through every 1m until a probe passes\n"
    ) in capsys.readouterr().out


def test_check_describes_the_health_check(tmp_path, capsys):
    health = {"health": "h:handle", "health_every": "10s"}
    path = write(tmp_path, kafka={"source": "python"}, breaker=health)

    assert main(["check", str(path)]) == EXIT_OK
    assert (
        "until a probe passes; paused while h:handle() says down (asked every 10s, within 2s)\n"
    ) in capsys.readouterr().out


def test_status_shows_the_breaker_and_its_next_probe() -> None:
    from retrylib.ops.render import _breaker_lines

    assert _breaker_lines(None) == []
    opened = {
        "state": "open",
        "since": "2026-11-25T04:00:00+00:00",
        "why": "600 of the last 1000 main-topic records failed",
        "next_probe_at": "2026-11-25T04:00:30+00:00",
    }
    assert _breaker_lines(opened)[1] == (
        "breaker: open since 2026-11-25T04:00:00+00:00 (600 of the last 1000 main-topic "
        "records failed); next probe at 2026-11-25T04:00:30+00:00"
    )


def test_check_warns_of_a_created_topic_kept_in_one_copy_on_a_cluster_of_several() -> None:
    def topic(*replicas: list[int]) -> SimpleNamespace:
        partitions = {i: SimpleNamespace(replicas=r) for i, r in enumerate(replicas)}
        return SimpleNamespace(error=None, partitions=partitions)

    topics = {"o.dlt": topic([1], [2, 3]), "o.retry.5s": topic([1, 2], [2, 3])}
    labels = [("o.dlt", "dead-letter topic 'o.dlt'"), ("o.retry.5s", "retry"), ("gone", "x")]
    cluster = SimpleNamespace(brokers=dict.fromkeys([1, 2, 3]), topics=topics)

    [warning] = single_copy_findings(cluster, labels)
    assert warning.level == "warning"
    assert warning.message.startswith(
        "dead-letter topic 'o.dlt' keeps one copy of its records on a cluster of 3 brokers"
    )
    assert single_copy_findings(SimpleNamespace(brokers={1: None}, topics=topics), labels) == []


def test_offline_leaves_out_the_broker_and_the_local_folders_of_a_cluster_config(tmp_path, capsys):
    (tmp_path / "a-file").write_text("")  # on the cluster the checkpoint's parent is a folder
    path = write(tmp_path, job={"checkpoint": str(tmp_path / "a-file" / "checkpoint")})

    assert main(["check", str(path)]) == EXIT_CONFIG
    assert "error: job.checkpoint: " in capsys.readouterr().err

    assert main(["check", str(path), "--offline"]) == EXIT_OK
    captured = capsys.readouterr()
    assert "broker" not in captured.err and "not reachable" not in captured.out
    assert captured.out.rstrip().endswith("ok (offline)")

    assert main(["check", str(path), "--offline", "--tables"]) == EXIT_CONFIG
    assert "--offline looks at no broker and no table" in capsys.readouterr().err


def test_offline_passes_the_bundle_config_whose_values_come_from_the_cluster(capsys, monkeypatch):
    for name in [name for name in os.environ if name.startswith("RETRYLIB_")]:
        monkeypatch.delenv(name)  # set on the cluster, not here
    config = REPO / "deploy/databricks/conf/orders.toml"

    assert main(["check", str(config), "--offline"]) == EXIT_OK, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "RETRYLIB_STORAGE_ROOT" in out and "taken as set where the job runs" in out


def test_offline_refuses_the_emr_config_until_its_placeholders_are_edited(tmp_path, capsys):
    """One line per key still holding a YOUR-... placeholder, naming the key and the
    placeholder; the same file edited passes."""
    shipped = (REPO / "deploy/emr/orders.toml").read_text()

    assert main(["check", str(REPO / "deploy/emr/orders.toml"), "--offline"]) == EXIT_CONFIG
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: {key}: still holds the placeholder {placeholder}: replace it with your own value"
        for key, placeholder in [
            ("job.checkpoint", "YOUR-BUCKET"),
            ("kafka.bootstrap_servers", "YOUR-BROKER-1"),
            ("output.table", "YOUR-BUCKET"),
            ("dead_letter.table", "YOUR-BUCKET"),
            ("metrics.table", "YOUR-BUCKET"),
        ]
    ]
    edited = tmp_path / "orders.toml"
    edited.write_text(shipped.replace("YOUR-BUCKET", "my-bucket").replace("YOUR-BROKER-", "b"))
    assert main(["check", str(edited), "--offline"]) == EXIT_OK, capsys.readouterr().err


def test_a_placeholder_is_refused_wherever_it_is_and_from_the_environment(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("RETRYLIB_TEST_BROKERS", "YOUR-BROKER:9092")
    path = write(
        tmp_path,
        kafka={
            "topics": ["orders", "YOUR-TOPIC"],
            "bootstrap_servers": "${env:RETRYLIB_TEST_BROKERS}",
        },
    )

    assert main(["check", str(path), "--offline"]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert "error: kafka.topics[1]: still holds the placeholder YOUR-TOPIC" in err
    assert "error: kafka.bootstrap_servers: still holds the placeholder YOUR-BROKER:" in err
    assert main(["run", str(path)]) == EXIT_CONFIG  # the job refuses it too
