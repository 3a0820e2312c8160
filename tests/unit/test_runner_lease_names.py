"""The names the runner and redrive leases go by (`retrylib.kafka.runner_lease`)."""

from __future__ import annotations

import os

import pytest

from retrylib.config.locations import location_id
from retrylib.kafka.runner_lease import holder_id, redrive_group, runner_group


def test_one_group_per_checkpoint_however_a_local_path_is_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    group = runner_group("orders", "cp")
    assert group == runner_group("orders", str(tmp_path / "cp"))
    assert group.startswith("_retrylib.orders.runner.")
    assert group != runner_group("orders", "other-cp")
    assert runner_group("orders", "s3://bucket/cp") != runner_group("orders", "s3://bucket/cp2")


def test_one_group_per_local_folder_through_a_symlink_or_a_trailing_slash(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "data")
    group = runner_group("orders", str(tmp_path / "data" / "ckpt"))
    assert runner_group("orders", str(tmp_path / "link" / "ckpt")) == group
    assert runner_group("orders", f"{tmp_path}/link/ckpt/") == group
    assert runner_group("orders", f"file://{tmp_path}/link//ckpt") == group
    assert runner_group("orders", f"file:{tmp_path}/data/./ckpt") == group


@pytest.mark.parametrize(
    ("spelling", "place"),
    [
        ("s3a://bucket/jobs/ckpt", "s3://bucket/jobs/ckpt"),
        ("s3n://bucket/jobs/ckpt/", "s3://bucket/jobs/ckpt"),
        ("S3://bucket//jobs/ckpt", "s3://bucket/jobs/ckpt"),
        ("hdfs://nn:8020/jobs/ckpt/", "hdfs://nn:8020/jobs/ckpt"),
        ("abfss://c@acct.dfs.core.windows.net/ckpt", "abfs://c@acct.dfs.core.windows.net/ckpt"),
        ("dbfs:/jobs/ckpt/", "dbfs:///jobs/ckpt"),
        ("file:///", "/"),
    ],
)
def test_a_uri_is_folded_to_one_spelling_per_place(spelling, place):
    assert location_id(spelling) == place
    assert location_id(place) == place  # an answer is its own spelling
    assert runner_group("orders", spelling) == runner_group("orders", place)


def test_places_apart_keep_groups_apart():
    assert runner_group("orders", "s3://a/ckpt") != runner_group("orders", "s3://b/ckpt")
    assert runner_group("orders", "hdfs://nn1/ckpt") != runner_group("orders", "hdfs://nn2/ckpt")
    assert runner_group("orders", "s3://a/ckpt") != runner_group("orders", "gs://a/ckpt")


def test_the_redrive_lease_is_the_jobs():
    assert redrive_group("orders") == "_retrylib.orders.redrive"


def test_a_holder_names_its_host_pid_and_start():
    name = holder_id("job 'orders'")
    assert name.startswith("retrylib job 'orders' host=")
    assert f" pid={os.getpid()} since=20" in name
