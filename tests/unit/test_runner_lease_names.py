"""The names the runner and redrive leases go by (`retrylib.kafka.runner_lease`)."""

from __future__ import annotations

import os

from retrylib.kafka.runner_lease import holder_id, redrive_group, runner_group


def test_one_group_per_checkpoint_however_a_local_path_is_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    group = runner_group("orders", "cp")
    assert group == runner_group("orders", str(tmp_path / "cp"))
    assert group.startswith("_retrylib.orders.runner.")
    assert group != runner_group("orders", "other-cp")
    assert runner_group("orders", "s3://bucket/cp") != runner_group("orders", "s3://bucket/cp2")


def test_the_redrive_lease_is_the_jobs():
    assert redrive_group("orders") == "_retrylib.orders.redrive"


def test_a_holder_names_its_host_pid_and_start():
    name = holder_id("job 'orders'")
    assert name.startswith("retrylib job 'orders' host=")
    assert f" pid={os.getpid()} since=20" in name
