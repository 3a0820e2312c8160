"""What one micro-batch did: the batch commit's report, handed to the metrics and the breaker."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class BatchResult:
    """What one batch did; `replayed` is true when its decisions came from a manifest."""

    batch_id: int
    replayed: bool
    counters: dict[str, int]
    produced: int
    output_committed: bool
    dead_letters_committed: bool
    duration_ms: int
    lateness_ms: dict[int, list[int]] = field(default_factory=dict)
    """Tier -> [p50, p99] of how late its records were handled; tiers with none left out."""
