"""Where the host's time in a jitted call goes, from a `jax.profiler` trace.

`profile_trace.jit_calls` gives the host's time in each jitted function's calls (`launch N ms a
step` in the trainer's progress line is the same span, timed by the loop). This module splits
that time among the host events the trace records inside the calls, on the calling thread:
JAX's and PjRt's argument handling (`ParseArguments`, `Handle inputs`), XLA's thunks
(`command_buffer::execute`, `command_buffer::update`, a convolution launched on its own), and the
CUDA driver calls CUPTI records (`cuGraphLaunch`, `cuLaunchKernel`, `cuMemsetD8Async`). Each event
counts its self time: its duration less that of the events nested in it, so that the self times
of a call's events sum to the call's duration. XLA numbers its thunks and graphs
(`command_buffer_465`, `cuGraphLaunch (CudaGraph:25)`): names are grouped with their numbers as N.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Iterable
from typing import Any

from scripts.bench import profile_trace

_NUMBER = re.compile(r"\d+")
# The trainer's train step in a trace: jax.jit's, or the executable with its convolutions in
# command buffers that it runs after the first step (jia_jax/step_graphs.py).
TRAIN_STEP_CALLS = ("PjitFunction(step)", "PjitFunction(jit(step))")


def _host_events(events: list[dict]) -> dict[tuple, list[tuple[float, float, str]]]:
    """The complete events of host threads, per (process, thread), as (start, end, name) sorted
    by start, the longer of two starting together first (the enclosing one)."""
    devices = profile_trace.device_pids(events)
    threads: dict[tuple, list[tuple[float, float, str]]] = collections.defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("pid") not in devices:
            start = float(e["ts"])
            threads[e["pid"], e["tid"]].append((start, start + float(e["dur"]), str(e["name"])))
    for spans in threads.values():
        spans.sort(key=lambda s: (s[0], -s[1]))
    return threads


def self_times(
    events: Iterable[dict], call: str | tuple[str, ...] = "PjitFunction("
) -> tuple[float, dict[str, tuple[float, int]]]:
    """The host's time in the outermost calls whose names start with `call` (or one of them), in
    µs, and each event name's (self µs, count) inside them, the calls' own events included
    (digits as N).

    An event that outlasts the one enclosing it counts only up to that one's end, so that the
    self times of a call's events sum to its duration.
    """
    total = 0.0
    out: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])

    def close(frame: dict[str, Any]) -> None:
        if frame["inside"]:
            entry = out[_NUMBER.sub("N", frame["name"])]
            entry[0] += frame["end"] - frame["start"] - frame["nested"]
            entry[1] += 1

    for spans in _host_events(list(events)).values():
        stack: list[dict[str, Any]] = []
        for start, end, name in spans:
            while stack and start >= stack[-1]["end"]:
                close(stack.pop())
            parent = stack[-1] if stack else None
            outer = bool(parent and parent["inside"])
            if parent:
                end = min(end, parent["end"])
                parent["nested"] += end - start
            if name.startswith(call) and not outer:
                total += end - start
            stack.append({"start": start, "end": end, "name": name, "nested": 0.0,
                          "inside": outer or name.startswith(call)})
        while stack:
            close(stack.pop())
    return total, {k: (v[0], int(v[1])) for k, v in out.items()}


def breakdown(
    events: Iterable[dict],
    steps: int,
    call: str | tuple[str, ...] = "PjitFunction(",
    n: int | None = 15,
) -> dict[str, Any]:
    """`self_times` per step: the calls' µs (`call_us_per_step`) and the `n` event names of
    most self time (all where None), each with its µs and count per step."""
    total, times = self_times(events, call)
    ranked = sorted(times.items(), key=lambda kv: -kv[1][0])[:n]
    return {
        "call_us_per_step": total / steps,
        "top": [{"name": name, "us_per_step": us / steps, "count_per_step": count / steps}
                for name, (us, count) in ranked],
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Prints `breakdown` of a trace file or `jax.profiler` log directory, one line a name."""
    import argparse  # noqa: PLC0415 - the command line only

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", help="a *.trace.json.gz file or a jax.profiler log directory")
    parser.add_argument("--steps", type=int, required=True, help="the steps the trace holds")
    parser.add_argument("--call", action="append",
                        help="repeatable: calls whose names start so (default PjitFunction()")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args(argv)
    events = profile_trace.load_events(args.trace)
    got = breakdown(events, args.steps, tuple(args.call or ["PjitFunction("]), args.top)
    print(f"host time in the calls: {got['call_us_per_step']:,.0f} µs a step; by self time:")
    for row in got["top"]:
        print(f"{row['us_per_step']:>10,.0f} µs {row['count_per_step']:>7.1f}x  {row['name']}")
    return got


if __name__ == "__main__":
    main()
