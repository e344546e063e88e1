"""Where an input thread's time goes, per batch: seconds summed by stage, read and reset by the
progress meter at each log step.

The train loop's `input wait` says that the input is the slower side; the stages say which part
of it (on the GPU path: waiting for the host's record batches, or for their decoding).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping


class StageClock:
    """Seconds per named stage of each batch, added from one thread, taken from another."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seconds: dict[str, float] = {}
        self._batches = 0

    def add_batch(self, seconds: Mapping[str, float]) -> None:
        """Counts one batch, which spent `seconds[stage]` in each stage."""
        with self._lock:
            for stage, value in seconds.items():
                self._seconds[stage] = self._seconds.get(stage, 0.0) + value
            self._batches += 1

    def take(self) -> dict[str, float]:
        """Mean milliseconds a batch per stage since the last take (empty if no batch was
        added), and starts over."""
        with self._lock:
            seconds, batches = self._seconds, self._batches
            self._seconds, self._batches = {}, 0
        return {k: 1e3 * v / batches for k, v in seconds.items()} if batches else {}


def describe(ms: Mapping[str, float]) -> str:
    """`read 3.1, decode 25`: ms a batch per stage (`StageClock.take`), as the progress line and
    the benchmarks' tables write them."""
    return ", ".join(f"{stage} {value:.3g}" for stage, value in ms.items())
