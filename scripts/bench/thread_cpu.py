"""Where a running process's CPU goes: CPU seconds a second of each of its threads, by the OS
name (`python -m jia_jax.main` names its Python threads: jia_jax/os_thread_names.py), and of its
child processes together, from samples of /proc (Linux).

`scripts.bench.train_input --thread_cpu` samples its trainer every second and keeps the shares
over the logged intervals after the first (those of its rate).
"""

from __future__ import annotations

import collections
import datetime
import os
import re
from collections.abc import Sequence
from typing import NamedTuple

TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
MAIN = "main thread"
UNNAMED = "unnamed threads"  # other threads still bearing the process's (the main thread's) name
CHILDREN = "child processes"
# An absl log line of the train loop's progress: its local time of day. The loop pads the step
# to the width of the last one (`step  250/1000`).
_PROGRESS_TIME = re.compile(
    r"^I\d{4} (\d\d):(\d\d):(\d\d(?:\.\d+)?) +\d+ loop\.py:\d+\] step +\d+/", re.MULTILINE
)


class Sample(NamedTuple):
    """One look at process `pid`: when (time.time()), its threads' (name, CPU ticks) by thread
    id, and each child process's CPU ticks (all its threads)."""

    pid: int
    wall: float
    threads: dict[int, tuple[str, int]]
    children: dict[int, int]


def sample(pid: int, wall: float) -> Sample:
    """`pid`'s threads and children now; threads or children that end meanwhile are left out."""
    threads = {}
    for tid in _ids(f"/proc/{pid}/task"):
        try:
            name = _read(f"/proc/{pid}/task/{tid}/comm").strip()
            threads[tid] = (name, _ticks(_read(f"/proc/{pid}/task/{tid}/stat")))
        except (OSError, ValueError, IndexError):
            pass
    children = {}
    for kid in _children(pid):
        try:
            children[kid] = _ticks(_read(f"/proc/{kid}/stat"))
        except (OSError, ValueError, IndexError):
            pass
    return Sample(pid, wall, threads, children)


def shares(first: Sample, last: Sample) -> dict[str, float]:
    """CPU seconds a second between two samples of one process, largest first: its first
    thread as MAIN, threads still named like it as UNNAMED, every other thread under its name
    (threads of one name summed), and the child processes together as CHILDREN. A thread or
    child started between them counts from 0."""
    seconds = last.wall - first.wall
    if seconds <= 0 or first.pid != last.pid:
        raise ValueError("not two samples of one process in time order")
    process_name = last.threads.get(last.pid, ("", 0))[0]
    ticks: collections.Counter[str] = collections.Counter()
    for tid, (name, now) in last.threads.items():
        before = first.threads.get(tid, (name, 0))[1]
        if tid == last.pid:
            name = MAIN
        elif name == process_name:
            name = UNNAMED
        ticks[name] += now - before
    ticks[CHILDREN] = sum(now - first.children.get(kid, 0) for kid, now in last.children.items())
    rates = {name: t / TICKS_PER_S / seconds for name, t in ticks.items()}
    return dict(sorted(rates.items(), key=lambda item: -item[1]))


def steady_window(samples: Sequence[Sample], log: str) -> tuple[Sample, Sample] | None:
    """The first and last samples between a `jia_jax.main` log's first and last progress lines
    (the intervals after the first: those of its rate), by the lines' local time of day; None if
    fewer than two samples fall between them (or the run crossed midnight)."""
    window = progress_window(log)
    if window is None:
        return None
    inside = [s for s in samples if window[0] <= local_seconds(s.wall) <= window[1]]
    return (inside[0], inside[-1]) if len(inside) >= 2 else None


def progress_window(log: str) -> tuple[float, float] | None:
    """The local times of day, in seconds, of a `jia_jax.main` log's first and last progress
    lines; None if it has fewer than two (or the run crossed midnight)."""
    times = [_seconds(*m.groups()) for m in _PROGRESS_TIME.finditer(log)]
    if len(times) < 2 or times[-1] < times[0]:
        return None
    return times[0], times[-1]


def _seconds(hours: str, minutes: str, seconds: str) -> float:
    return 3600 * int(hours) + 60 * int(minutes) + float(seconds)


def local_seconds(wall: float) -> float:
    """`wall` (time.time()) as seconds since local midnight, as absl writes a line's time."""
    t = datetime.datetime.fromtimestamp(wall)
    return 3600 * t.hour + 60 * t.minute + t.second + t.microsecond / 1e6


def _ids(path: str) -> list[int]:
    try:
        return [int(name) for name in os.listdir(path)]
    except OSError:
        return []


def _children(pid: int) -> list[int]:
    kids = []
    for tid in _ids(f"/proc/{pid}/task"):
        try:
            kids += [int(k) for k in _read(f"/proc/{pid}/task/{tid}/children").split()]
        except OSError:
            pass
    return kids


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def _ticks(stat: str) -> int:
    """User + system CPU ticks from a /proc stat line (fields 14 and 15; the name in brackets
    may hold spaces, so count from its closing bracket)."""
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])
