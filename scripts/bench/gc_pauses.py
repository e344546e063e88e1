r"""Runs a module as `python -m` would, with every pass of Python's garbage collector timed.

Python's collector stops the thread that triggered it, holding the interpreter lock, until the
pass ends; a full pass (generation 2) walks every tracked object of the process, which in a
trainer is hundreds of thousands. A thread of the trainer that waits for the lock meanwhile (the
one launching the steps, or feeding them) is late by as long. This wraps a program (the trainer)
with a `gc.callbacks` timer and, at its exit, writes each pass's wall-clock start, generation and
milliseconds to --out as JSON. With --unfrozen, `gc.freeze` does nothing in the program: the
trainer as it ran before it froze what it had built (jia_jax/loop.py).

  python -m scripts.bench.gc_pauses --out=/tmp/gc.json -- -m jia_jax.main \
      --config=configs/resnet50_64k.py ...

`summary` reads such a file over a trainer log's steady window (its progress lines after the
first, as scripts/bench/train_input.py rates a run).
"""

from __future__ import annotations

import argparse
import atexit
import gc
import json
import time
from collections.abc import Sequence
from typing import Any

from scripts.bench import thread_cpu, wrapped_program


class PauseTimer:
    """A `gc.callbacks` entry recording (wall-clock start, generation, ms) of each pass."""

    def __init__(self) -> None:
        self.pauses: list[tuple[float, int, float]] = []
        self._start: tuple[float, float] | None = None

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = (time.time(), time.perf_counter())
        elif self._start is not None:
            wall, start = self._start
            self.pauses.append((wall, info["generation"], 1e3 * (time.perf_counter() - start)))
            self._start = None


def summary(pauses: Sequence[Sequence[float]], log: str) -> dict[str, Any] | None:
    """Per generation: the passes that started inside the log's steady window (between its
    first and last progress lines), their count, total and longest ms, and ms per second of the
    window; None if the log has fewer than two progress lines."""
    window = thread_cpu.progress_window(log)
    if window is None:
        return None
    first, last = window
    inside = [p for p in pauses if first <= thread_cpu.local_seconds(p[0]) <= last]
    out: dict[str, Any] = {"window_s": last - first}
    for generation in (0, 1, 2):
        ms = [p[2] for p in inside if p[1] == generation]
        out[f"gen{generation}"] = {
            "passes": len(ms),
            "total_ms": sum(ms),
            "max_ms": max(ms, default=0.0),
            "ms_per_s": sum(ms) / (last - first) if last > first else 0.0,
        }
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the passes, as JSON, written at exit")
    parser.add_argument("--unfrozen", action="store_true",
                        help="gc.freeze does nothing in the program")
    wrapped_program.add_argument(parser)
    args = parser.parse_args(argv)
    program = wrapped_program.module_argv(parser, args.program)
    timer = PauseTimer()
    gc.callbacks.append(timer)
    if args.unfrozen:
        gc.freeze = lambda: None

    def write() -> None:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"unfrozen": args.unfrozen, "pauses": timer.pauses}, f)

    atexit.register(write)
    wrapped_program.run(program)


if __name__ == "__main__":
    main()
