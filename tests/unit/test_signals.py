"""Stop requests: which JVMs get retrylib's signal handler, and how it hands a second signal
back to the JVM. The JVM is a stand-in for Py4J's view of it (no Spark, no sockets)."""

from __future__ import annotations

import os
import signal
from types import SimpleNamespace

import pytest
from py4j.protocol import Py4JError

from retrylib.spark import signals


class FakeSignalClass:
    """`jvm.sun.misc.Signal`: constructor, and the static `handle` keeping one handler each."""

    def __init__(self) -> None:
        self.handlers = {"TERM": "jvm-default-TERM", "INT": "jvm-default-INT"}

    def __call__(self, name: str) -> SimpleNamespace:
        return SimpleNamespace(name=name, getName=lambda: name)

    def handle(self, sig: SimpleNamespace, handler: object) -> object:
        previous, self.handlers[sig.name] = self.handlers[sig.name], handler
        return previous


def fake_spark(main_class: str) -> tuple[SimpleNamespace, FakeSignalClass]:
    signal_class = FakeSignalClass()
    jvm = SimpleNamespace(
        java=SimpleNamespace(
            lang=SimpleNamespace(System=SimpleNamespace(getProperty=lambda _: main_class))
        ),
        sun=SimpleNamespace(misc=SimpleNamespace(Signal=signal_class)),
    )
    context = SimpleNamespace(_jvm=jvm, _gateway=object())
    return SimpleNamespace(sparkContext=context), signal_class


@pytest.fixture(autouse=True)
def no_callback_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("pyspark.java_gateway.ensure_callback_server_started", lambda gw: None)


def test_a_signal_to_the_spark_submit_jvm_requests_the_stop_and_hands_back_the_next() -> None:
    spark, jvm_signals = fake_spark("org.apache.spark.deploy.SparkSubmit jobs/run_job.py c.toml")
    with signals.stop_requests(spark) as requested:
        term = jvm_signals.handlers["TERM"]
        assert isinstance(term, signals._JvmSignalHandler)
        assert isinstance(jvm_signals.handlers["INT"], signals._JvmSignalHandler)
        assert not requested.is_set()

        term.handle(jvm_signals("TERM"))

        assert requested.is_set()
        # the JVM's own handler is back: a second SIGTERM ends the JVM at once
        assert jvm_signals.handlers["TERM"] == "jvm-default-TERM"
    assert jvm_signals.handlers == {"TERM": "jvm-default-TERM", "INT": "jvm-default-INT"}


def test_a_jvm_that_outlives_the_driver_keeps_its_handlers() -> None:
    spark, jvm_signals = fake_spark("com.databricks.backend.daemon.driver.DriverDaemon")
    before = signal.getsignal(signal.SIGTERM)
    with signals.stop_requests(spark) as requested:
        assert jvm_signals.handlers == {"TERM": "jvm-default-TERM", "INT": "jvm-default-INT"}
        os.kill(os.getpid(), signal.SIGTERM)  # the Python driver's own signal still works
        assert requested.is_set()
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_spark_connect_client_takes_only_its_own_signals() -> None:
    class ConnectSession:  # the server's JVM is out of reach
        __module__ = "pyspark.sql.connect.session"

        @property
        def sparkContext(self) -> None:
            raise AssertionError("a Spark Connect session has no SparkContext")

    before = signal.getsignal(signal.SIGINT)
    with signals.stop_requests(ConnectSession()) as requested:
        os.kill(os.getpid(), signal.SIGINT)
        assert requested.is_set()
    assert signal.getsignal(signal.SIGINT) is before


def test_a_jvm_already_gone_at_the_end_does_not_fail_the_job() -> None:
    spark, jvm_signals = fake_spark("org.apache.spark.deploy.SparkSubmit jobs/run_job.py c.toml")
    before = signal.getsignal(signal.SIGTERM)
    with signals.stop_requests(spark):

        def gone(sig: SimpleNamespace, handler: object) -> object:
            raise Py4JError("Answer from Java side is empty")

        jvm_signals.handle = gone
    assert signal.getsignal(signal.SIGTERM) is before  # and leaving it raised nothing


def test_a_second_signal_to_the_driver_ends_it_at_once(monkeypatch, caplog) -> None:
    exits: list[int] = []
    monkeypatch.setattr(signals, "_exit_now", exits.append)
    spark, _ = fake_spark("org.apache.spark.deploy.SparkSubmit jobs/run_job.py c.toml")
    with signals.stop_requests(spark) as requested:
        os.kill(os.getpid(), signal.SIGTERM)
        assert requested.is_set() and exits == []
        os.kill(os.getpid(), signal.SIGTERM)
    assert exits == [128 + signal.SIGTERM]
    assert "received SIGTERM again: stopping now" in caplog.text
