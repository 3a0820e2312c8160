"""The steps of a batch: where the job reports them, and what a listener hears."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from retrylib import steps

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def heard() -> Iterator[list[tuple[str, int]]]:
    calls: list[tuple[str, int]] = []
    steps.set_listener(lambda step, batch_id: calls.append((step, batch_id)))
    try:
        yield calls
    finally:
        steps.set_listener(None)


def test_the_listener_hears_each_step_reached_with_its_batch(heard) -> None:
    steps.reached("after_manifest", 4)
    steps.reached("after_cleanup", 4)
    assert heard == [("after_manifest", 4), ("after_cleanup", 4)]


def test_a_step_reached_without_a_listener_does_nothing(heard) -> None:
    steps.set_listener(None)
    steps.reached("after_manifest", 4)
    assert heard == []


def test_what_the_listener_raises_fails_the_step(heard) -> None:
    def refuse(step: str, batch_id: int) -> None:
        raise RuntimeError(f"{step}@{batch_id}")

    steps.set_listener(refuse)
    with pytest.raises(RuntimeError, match="after_produce@2"):
        steps.reached("after_produce", 2)


def test_every_step_is_reached_in_one_place() -> None:
    source = "".join(path.read_text() for path in sorted((REPO / "retrylib").rglob("*.py")))
    assert sorted(re.findall(r'\breached\("(\w+)"', source)) == sorted(steps.STEPS)
