"""retrylib's batch state in the checkpoint stays a few files however many batches run, and
a damaged file in it is named with the way out (local files, no Spark)."""

from __future__ import annotations

from pathlib import Path

import pytest

from retrylib.errors import DamagedFile, RetrylibError
from retrylib.state.checkpoint import MANIFESTS_KEPT, STAGING_FOLDER, Checkpoint, expired_state
from retrylib.state.files import read_json

OFFSETS = 'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1700000000000}\n{"orders":{"0":42}}\n'


def test_staging_folders_of_earlier_batches_expire_but_not_this_ones() -> None:
    assert sorted(expired_state(STAGING_FOLDER, ["3", "4", "5", "6", ".crc", "x"], 5)) == ["3", "4"]


def test_manifests_beyond_the_last_few_and_crashed_writes_expire() -> None:
    names = [f"{n}.json" for n in range(100)] + ["99.json.tmp-123", "100.json.tmp-9", "x.json"]
    expired = expired_state("manifests", names, 99)
    assert sorted(expired, key=lambda n: int(n.partition(".")[0])) == [
        *(f"{n}.json" for n in range(99 - MANIFESTS_KEPT)),
        "99.json.tmp-123",  # a crashed write of this batch; a later batch's is not touched
    ]


def test_over_many_batches_the_state_stays_bounded() -> None:
    staging: set[str] = set()
    manifests: set[str] = set()
    for batch in range(1000):
        staging.add(str(batch))
        manifests.add(f"{batch}.json")
        staging -= set(expired_state(STAGING_FOLDER, staging, batch))
        manifests -= set(expired_state("manifests", manifests, batch))
    assert staging == {"999"}
    assert len(manifests) == MANIFESTS_KEPT + 1


def checkpoint_with_offsets(
    root: Path, texts: dict[int, str], manifests: tuple[int, ...]
) -> Checkpoint:
    checkpoint = Checkpoint(str(root))
    (root / "spark" / "offsets").mkdir(parents=True)
    for number, text in texts.items():
        (root / "spark" / "offsets" / str(number)).write_text(text)
    Path(checkpoint.manifests).mkdir(parents=True)
    for number in manifests:
        Path(checkpoint.manifest(number)).write_text("{}")
    return checkpoint


def test_a_manifest_cut_short_is_named_as_damaged(tmp_path: Path) -> None:
    (tmp_path / "3.json").write_text('{"rows": {"out')
    with pytest.raises(DamagedFile, match=r"3\.json is damaged \(not JSON: ") as raised:
        read_json(None, str(tmp_path / "3.json"))  # type: ignore[arg-type]
    assert raised.value.uri == str(tmp_path / "3.json")


def test_spark_offsets_are_read_and_a_good_log_passes(tmp_path: Path) -> None:
    checkpoint = checkpoint_with_offsets(tmp_path, {0: OFFSETS, 1: OFFSETS}, (0, 1))
    checkpoint.check_offsets_log(None)
    assert checkpoint.batch_offsets(None, 1) == ({("orders", 0): 42}, 1700000000000)


def test_a_damaged_latest_offsets_file_of_a_batch_not_routed_may_be_removed(tmp_path: Path) -> None:
    checkpoint = checkpoint_with_offsets(tmp_path, {0: OFFSETS, 1: OFFSETS[:40]}, (0,))
    with pytest.raises(RetrylibError) as raised:
        checkpoint.check_offsets_log(None)
    message = str(raised.value)
    assert message.startswith(f"Spark's offsets file {tmp_path}/spark/offsets/1 is damaged (")
    assert "batch 1 was not routed yet (it has no manifest): remove the file" in message


def test_a_damaged_offsets_file_of_a_routed_batch_must_be_restored(tmp_path: Path) -> None:
    checkpoint = checkpoint_with_offsets(tmp_path, {4: "{}\n"}, (4,))
    with pytest.raises(RetrylibError, match="no version line") as raised:
        checkpoint.check_offsets_log(None)
    assert "batch 4 was routed from it: restore the file from a backup" in str(raised.value)


def test_a_spark_log_file_left_half_written_is_removed_and_complete_ones_kept(
    tmp_path: Path,
) -> None:
    # What a kill while Spark wrote batch 0's offsets left (CI, a kill at after_query_start):
    # Spark 4.2 would refuse every start with STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY.
    checkpoint = Checkpoint(str(tmp_path))
    offsets, commits = Path(checkpoint.spark) / "offsets", Path(checkpoint.spark) / "commits"
    offsets.mkdir(parents=True)
    commits.mkdir()
    temporary = ".1.f3bfa28c-25fd-41cf-a4a5-6b4c94428787.tmp"
    kept = ["0", ".0.crc", "1"]
    for name in [*kept, temporary, f".{temporary}.crc"]:
        (offsets / name).write_text(OFFSETS if name.isdigit() else "")
    (commits / ".0.0a1b2c3d-0000-4000-8000-000000000000.tmp").write_text("")

    removed = checkpoint.remove_unfinished_spark_log_files(None)

    assert len(removed) == 3
    assert sorted(p.name for p in offsets.iterdir()) == sorted(kept)
    assert list(commits.iterdir()) == []
    assert checkpoint.check_offsets_log(None) == {("orders", 0): 42}
