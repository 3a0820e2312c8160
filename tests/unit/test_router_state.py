"""retrylib's batch state in the checkpoint stays a few files however many batches run."""

from __future__ import annotations

from retrylib.checkpoint import MANIFESTS_KEPT, expired_state


def test_staging_folders_of_earlier_batches_expire_but_not_this_ones() -> None:
    assert sorted(expired_state("staged", ["3", "4", "5", "6", ".crc", "x"], 5)) == ["3", "4"]


def test_manifests_beyond_the_last_few_and_crashed_writes_expire() -> None:
    names = [f"{n}.json" for n in range(100)] + ["99.json.tmp-123", "100.json.tmp-9", "x.json"]
    expired = expired_state("manifests", names, 99)
    assert sorted(expired, key=lambda n: int(n.partition(".")[0])) == [
        *(f"{n}.json" for n in range(99 - MANIFESTS_KEPT)),
        "99.json.tmp-123",  # a crashed write of this batch; a later batch's is not touched
    ]


def test_over_many_batches_the_state_stays_bounded() -> None:
    staged: set[str] = set()
    manifests: set[str] = set()
    for batch in range(1000):
        staged.add(str(batch))
        manifests.add(f"{batch}.json")
        staged -= set(expired_state("staged", staged, batch))
        manifests -= set(expired_state("manifests", manifests, batch))
    assert staged == {"999"}
    assert len(manifests) == MANIFESTS_KEPT + 1
