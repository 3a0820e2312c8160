"""Secrets stay masked in every process of a job, Spark's Python workers included."""

from __future__ import annotations

import subprocess
import sys
import uuid

from helpers import produce, run_retrylib

VARIABLE = "RETRYLIB_TEST_CLIENT_ID"


def test_a_value_from_the_environment_is_masked_in_the_workers_output(
    bootstrap_servers, make_topic, write_config, monkeypatch
):
    secret = f"client-{uuid.uuid4().hex}"
    monkeypatch.setenv(VARIABLE, secret)
    topic = make_topic("masked", partitions=2)
    produce(bootstrap_servers, topic, [(f"ok-{i}", "v") for i in range(20)], partitions=2)
    # "python": the routing tasks read Kafka themselves, with consumers in the Python
    # workers. linger.ms is a producer property, so librdkafka warns on every consumer, in
    # a line that starts with the client id.
    config = write_config(
        [topic],
        name="masked",
        kafka={
            "source": "python",
            "options": {"client.id": f"${{env:{VARIABLE}}}", "linger.ms": "10"},
        },
    )
    done = run_retrylib(
        "run", config.source_path, "--available-now", "--master", "local[2]", timeout=300
    )

    assert done.returncode == 0, done.stderr[-3000:]
    assert secret not in done.stdout + done.stderr
    assert "CONFWARN [***#consumer-" in done.stderr, done.stderr[-3000:]


WORKER = """
import logging, sys
from retrylib.kafka.clients import client_config
secret = sys.argv[1]
config = client_config("127.0.0.1:1", {"client.id": secret, "linger.ms": "5"}, {"client.id"})
config["logger"].warning("CONFWARN [%s#consumer-1] [thrd:app]: a librdkafka line", secret)
logging.getLogger("retrylib.source.range_reader").warning("reading with client %s", secret)
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
