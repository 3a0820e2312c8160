"""The dead-letter reasons and batch counters are named once (retry/outcomes.py), and the
README documents each of them."""

from __future__ import annotations

import re
from pathlib import Path

from retrylib.retry.outcomes import Count, Reason, retried_tier
from retrylib.retry.policy import DeadLetterDecision

README = (Path(__file__).parents[2] / "README.md").read_text()


def test_the_readme_lists_every_dead_letter_reason() -> None:
    row = next(line for line in README.splitlines() if line.startswith("| `retrylib.dead_letter"))
    assert set(re.findall(r"`([a-z_]+)`", row)) == {reason.value for reason in Reason}


def test_the_readme_has_a_row_for_every_counter() -> None:
    rows = re.findall(r"^\| `([a-z_N]+)` \| ", README, flags=re.M)
    counters = [name for name in rows if name in {c.value for c in Count} or name.endswith("_N")]
    assert counters == [c.value for c in Count] + ["retried_tier_N"]


def test_names_are_plain_text_where_they_are_stored() -> None:
    assert DeadLetterDecision(Reason.RETRY_TIMEOUT).reason == "retry_timeout"
    assert Reason.RECORD_TOO_LARGE.encode() == b"record_too_large"  # the dead-letter header
    assert retried_tier(2) == "retried_tier_2"
    assert {Count.SUCCEEDED: 1} == {"succeeded": 1}  # counters read back from JSON
