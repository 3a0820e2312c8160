"""The dead-letter reasons and batch counters are named once (retry/outcomes.py), and the
docs list each of them: the reasons with the retry headers, the counters with the metrics."""

from __future__ import annotations

import re
from pathlib import Path

from retrylib.retry.outcomes import Count, ForwardCount, Reason, retried_tier
from retrylib.retry.policy import DeadLetterDecision

DOCS = Path(__file__).parents[2] / "docs"


def test_the_retry_headers_page_lists_every_dead_letter_reason() -> None:
    headers = (DOCS / "retries.md").read_text()
    row = next(line for line in headers.splitlines() if line.startswith("| `retrylib.dead_letter"))
    assert set(re.findall(r"`([a-z_]+)`", row)) == {reason.value for reason in Reason}


def test_the_operating_page_has_a_row_for_every_counter() -> None:
    rows = re.findall(r"^\| `([a-z_N]+)` \| ", (DOCS / "operating.md").read_text(), flags=re.M)
    named = {c.value for c in Count} | {c.value for c in ForwardCount}
    counters = [name for name in rows if name in named or name.endswith("_N")]
    assert counters == [*Count, "retried_tier_N", *ForwardCount]


def test_names_are_plain_text_where_they_are_stored() -> None:
    assert DeadLetterDecision(Reason.RETRY_TIMEOUT).reason == "retry_timeout"
    assert Reason.RECORD_TOO_LARGE.encode() == b"record_too_large"  # the dead-letter header
    assert retried_tier(0) == "retried_tier_1"  # tiers are numbered from 1 to users
    assert {Count.SUCCEEDED: 1} == {"succeeded": 1}  # counters read back from JSON
