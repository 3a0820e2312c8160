"""A circuit breaker against floods of failures (`[breaker]`).

When at least `failure_share` of the latest `window` main-topic records failed (retried or
dead-lettered; `Skip` is not a failure), the breaker opens: the job stops taking new
main-topic records, while the retry tiers go on as before. Every `probe_every` it lets
`probe_records` main-topic records in; when fewer than `failure_share` of a probe fail, it
closes and the main topics flow again, else it stays open until the next probe.

The driver keeps the state (`Breaker`, after each batch) and writes it to a file on the
driver's node; retrylib's Kafka source, whose planner runs there too, reads it each time it
plans a batch (`main_topic_allowance`) and holds the main topics at their start offsets, or
lets the probe's records through. Each change is also published (`on_change`: the job puts
it in the checkpoint, where `retrylib status` reads it). The state lives as long as the
job's process: a restarted job starts closed, and trips again within one window if the
failures go on.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from retrylib.config.model import BreakerConfig

log = logging.getLogger(__name__)

CLOSED, OPEN = "closed", "open"


@dataclass(frozen=True)
class BreakerState:
    """What the source needs: whether main topics are held, and when the next probe is;
    whether everything is paused (`[breaker] health` says the downstream is down)."""

    phase: str  # CLOSED or OPEN
    probe_at_ms: int = 0  # when open: main-topic records flow again from then ...
    probe_records: int = 0  # ... this many of them, until the driver decides
    paused: bool = False  # main topics and retry tiers alike held where they are


class Breaker:
    """The driver's side: feeds each batch's main-topic outcomes to the window, trips, probes
    and closes, writing every change of state to `state_file`."""

    def __init__(
        self,
        config: BreakerConfig,
        state_file: Path,
        on_change: Callable[[BreakerState, str], None] | None = None,
    ) -> None:
        """`on_change` is called with each new state and why, after `state_file` has it."""
        self.config = config
        self.state_file = state_file
        self._on_change = on_change
        self._lock = threading.Lock()  # the batches' thread and the health watch's
        self.state = BreakerState(CLOSED)
        self._paused_at = 0.0  # monotonic, when the pause (if `state.paused`) began
        self._counted_to = 0.0  # monotonic: the pause until then is in `_paused_s`
        self._paused_s = 0.0  # spent paused since the last `take_paused_ms`
        self._window: deque[tuple[int, int]] = deque()  # (records, failed) per batch
        write_state(state_file, self.state)
        if on_change is not None:
            on_change(self.state, "the job started")

    def state_name(self) -> str:
        """`paused` while the health check holds everything, else the phase."""
        return "paused" if self.state.paused else self.state.phase

    def health(self, up: bool, why: str) -> None:
        """Pause everything while the downstream is down (`up` false), resume when it is up."""
        with self._lock:
            if up == (not self.state.paused):
                return
            now = time.monotonic()
            if up:
                self._paused_s += now - self._counted_to
                log.warning(
                    "resumed after %.1f s paused: %s; main topics and retry tiers flow again",
                    now - self._paused_at,
                    why,
                )
            else:
                self._paused_at = self._counted_to = now
                log.warning(
                    "paused: %s; no main-topic record is read and due retries wait, keeping "
                    "their attempts",
                    why,
                )
            self._write(replace(self.state, paused=not up), why)

    def take_paused_ms(self) -> int:
        """How long the job was paused since the last call, in ms (a batch's `paused_ms`)."""
        with self._lock:
            paused_s, self._paused_s = self._paused_s, 0.0
            if self.state.paused:
                now = time.monotonic()
                paused_s += now - self._counted_to
                self._counted_to = now
            return round(paused_s * 1000)

    def after_batch(self, records: int, failed: int, now_ms: int) -> None:
        """Take a batch's `records` main-topic records, of which `failed` failed."""
        if records == 0:
            return
        with self._lock:
            self._after_batch(records, failed, now_ms)

    def _after_batch(self, records: int, failed: int, now_ms: int) -> None:
        if self.state.phase == OPEN:  # the batch's main-topic records were a probe
            if failed < self.config.failure_share * records:
                self._change(BreakerState(CLOSED), f"a probe passed ({failed} of {records} failed)")
                self._window.clear()
            else:
                self._open(now_ms, f"a probe failed ({failed} of {records} failed)")
            return
        self._window.append((records, failed))
        # Whole batches: drop the oldest while the rest still cover the window.
        while sum(r for r, _ in self._window) - self._window[0][0] >= self.config.window:
            self._window.popleft()
        in_window = sum(r for r, _ in self._window)
        failed_in_window = sum(f for _, f in self._window)
        if in_window >= self.config.window and (
            failed_in_window >= self.config.failure_share * in_window
        ):
            self._open(
                now_ms, f"{failed_in_window} of the last {in_window} main-topic records failed"
            )

    def _open(self, now_ms: int, why: str) -> None:
        probe_at = now_ms + self.config.probe_every_ms
        self._change(BreakerState(OPEN, probe_at, self.config.probe_records), why)

    def _change(self, state: BreakerState, why: str) -> None:
        if state.phase == OPEN:
            log.warning(
                "breaker open: %s; main topics held while retry tiers go on; a probe of %d "
                "records in %.0f s",
                why,
                state.probe_records,
                self.config.probe_every_ms / 1000,
            )
        else:
            log.warning("breaker closed: %s; main topics flow again", why)
        self._write(replace(state, paused=self.state.paused), why)

    def _write(self, state: BreakerState, why: str) -> None:
        self.state = state
        write_state(self.state_file, state)
        if self._on_change is not None:
            self._on_change(state, why)


def write_state(path: Path, state: BreakerState) -> None:
    """Replace the state file at `path` in one step (the source may read it at any time)."""
    draft = path.with_name(path.name + ".tmp")
    draft.parent.mkdir(parents=True, exist_ok=True)  # on a Spark Connect server, made here
    draft.write_text(json.dumps(state.__dict__))
    os.replace(draft, path)


def read_state(path: str) -> BreakerState:
    """The state in the file at `path`; a file not written yet reads as closed."""
    try:
        return BreakerState(**json.loads(Path(path).read_text()))
    except FileNotFoundError:
        return BreakerState(CLOSED)


def main_topic_allowance(state: BreakerState, now_ms: int) -> int | None:
    """How many main-topic records the next batch may take: None for no limit."""
    if state.phase == CLOSED:
        return None
    return state.probe_records if now_ms >= state.probe_at_ms else 0
