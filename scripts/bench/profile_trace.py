"""Reads a `jax.profiler` trace of GPU steps: where the device time goes, and what overlaps.

`jax.profiler.trace(log_dir)` writes `<log_dir>/plugins/profile/<run>/*.trace.json.gz` (Chrome
trace format). Each GPU is a process named `/device:GPU:<i>`; its CUDA streams are threads named
`Stream #<n>(...)`, holding one event per kernel or memcpy. This module turns those events into
per-device timelines and the figures a reader needs to judge a data-parallel step:

  * busy time per kind of kernel (convolutions/GEMMs, XLA fusions, NCCL collectives, copies),
  * how much of the collective time runs while compute kernels run (overlap) and how much is
    exposed, and how long the device sits idle (waiting on the host: launch-bound),

without TensorBoard or any other package.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import glob
import gzip
import json
import os
from collections.abc import Iterable, Sequence

# Substrings of kernel names (lower case), checked in `kernel_kind`'s order.
_COLLECTIVE = ("nccl",)
_COPY = ("memcpy", "memset")
_CONV_GEMM = (
    "conv",
    "xmma",
    "gemm",
    "cutlass",
    "cudnn",
    "cublas",
    "wgmma",
    "nvjet",
    "dgrad",
    "wgrad",
    "fprop",
    "nhwc",
    "nchw",
)
_CONCAT_SLICE = ("concatenate", "slice", "dynamic_update")
# Other libraries' kernels whose names hold a mark of `_CONV_GEMM` and are no convolution:
# nvJPEG's colour conversion (`nvjpeg::ycbcr_to_format_kernel_roi<..., nvjpeg::ConvertToFormat`).
_NOT_CONV_GEMM = ("nvjpeg",)
# Kernels XLA generates itself are named after their HLO: `loop_convert_fusion_3`,
# `input_reduce_fusion`, `wrapped_convert` (one op, unfused). Their op names say nothing about
# convolutions ("convert" contains "conv"), except XLA's Triton GEMMs (`gemm_fusion_dot_2`).
_XLA_MARKS = ("fusion", "wrapped_")
_XLA_GEMM = ("gemm",)
COMPUTE_KINDS = ("conv/gemm", "fusion", "concat/slice", "copy")

# `fusion_breakdown`'s categories for what `kernel_kind` leaves as fusion or concat/slice, by name
# substrings, checked in this order (the first match wins): pooling before bn/reduction because
# `reduce_window` contains "reduce"; bn/reduction before transpose/layout because a reduction
# kernel stays one whatever it transposes on the way.
_FUSION_CATEGORIES = (
    ("pooling", ("reduce_window", "reduce-window", "select_and_scatter", "scatter")),
    ("bn/reduction", ("reduce",)),
    ("transpose/layout", ("transpose",)),
)
BREAKDOWN_CATEGORIES = (
    "conv/gemm",
    "bn/reduction",
    "elementwise",
    "transpose/layout",
    "pooling",
    "copy",
    "collective",
    "other",
)


@dataclasses.dataclass(frozen=True)
class Kernel:
    """One device activity: a kernel or a memory copy on a stream."""

    name: str
    start_us: float
    end_us: float
    stream: str
    kind: str


def kernel_kind(name: str) -> str:
    """The kind of a kernel from its name: collective, copy, conv/gemm, concat/slice or fusion.

    In order: NCCL kernels are collective; memcpy/memset copy; kernels XLA generates (names with
    "fusion" or "wrapped_") are conv/gemm only if they are XLA's GEMM fusions ("gemm"), else
    concat/slice for concatenate/slice/dynamic-update-slice, else fusion; library kernels
    (cuDNN, cuBLAS, CUTLASS, nvjet, xmma) are conv/gemm, nvJPEG's are not; anything else is
    fusion.
    """
    lower = name.lower()
    if any(k in lower for k in _COLLECTIVE):
        return "collective"
    if any(k in lower for k in _COPY):
        return "copy"
    if any(k in lower for k in _NOT_CONV_GEMM):
        return "fusion"
    if any(k in lower for k in _XLA_MARKS):
        if any(k in lower for k in _XLA_GEMM):
            return "conv/gemm"
    elif any(k in lower for k in _CONV_GEMM):
        return "conv/gemm"
    if any(k in lower for k in _CONCAT_SLICE):
        return "concat/slice"
    return "fusion"


def breakdown_category(name: str) -> str:
    """`fusion_breakdown`'s category of one kernel name; see there."""
    kind = kernel_kind(name)
    if kind in ("conv/gemm", "copy", "collective"):
        return kind
    lower = name.lower()
    for category, keys in _FUSION_CATEGORIES:
        if any(k in lower for k in keys):
            return category
    return "elementwise" if lower.startswith("loop_") else "other"


def fusion_breakdown(kernels: Sequence[Kernel], steps: int) -> dict[str, dict[str, float]]:
    """Per-step device time and kernel count of one device's kernels, by what the kernels do.

    Categories (`BREAKDOWN_CATEGORIES`), decided from the kernel name in this order:
      1. "conv/gemm", "copy", "collective": as `kernel_kind` says.
      2. "pooling": names with "reduce_window", "select_and_scatter" or "scatter" (max/avg
         pooling and the max-pool gradient), e.g. `loop_reduce_window_fusion`,
         `input_scatter_fusion`.
      3. "bn/reduction": names with "reduce" (batch-norm statistics and their gradients, loss and
         norm sums), e.g. `input_reduce_fusion`, `input_add_reduce_fusion`,
         `input_reduce_select_fusion`, `input_multiply_reduce_fusion`.
      4. "transpose/layout": names with "transpose", e.g. `input_convert_transpose_fusion`.
      5. "elementwise": other names starting with "loop_" (XLA's elementwise loop fusions,
         concatenations and casts among them), e.g. `loop_convert_fusion_3`.
      6. "other": everything else (e.g. unfused `wrapped_*` kernels, unknown library kernels).

    Args:
      kernels: one device's kernels over `steps` traced steps.
      steps: the number of traced steps, to divide by.

    Returns:
      `{category: {"us_per_step": ..., "count_per_step": ...}}` for every category, in
      `BREAKDOWN_CATEGORIES` order (zeros where no kernel falls in one).
    """
    totals = {c: [0.0, 0] for c in BREAKDOWN_CATEGORIES}
    for k in kernels:
        t = totals[breakdown_category(k.name)]
        t[0] += k.end_us - k.start_us
        t[1] += 1
    return {
        c: {"us_per_step": t / steps, "count_per_step": n / steps} for c, (t, n) in totals.items()
    }


def find_trace_file(log_dir: str) -> str:
    """The newest `*.trace.json.gz` under a `jax.profiler.trace` log directory."""
    files = glob.glob(os.path.join(log_dir, "plugins", "profile", "*", "*.trace.json.gz"))
    if not files:
        raise FileNotFoundError(f"no *.trace.json.gz under {log_dir}/plugins/profile/")
    return max(files, key=os.path.getmtime)


def process_names(events: Sequence[dict]) -> dict[object, str]:
    """Each process id of a trace's events and its name (its `process_name` metadata event)."""
    return {
        e["pid"]: str(e.get("args", {}).get("name", ""))
        for e in events
        if e.get("ph") == "M" and e.get("name") == "process_name"
    }


def device_pids(events: Sequence[dict]) -> set[object]:
    """The process ids of a trace's devices (`/device:...`): every other process is the host's."""
    return {pid for pid, name in process_names(events).items() if name.startswith("/device:")}


def device_kernels(events: Iterable[dict]) -> dict[str, list[Kernel]]:
    """Kernels per GPU (`/device:GPU:i`), sorted by start, from Chrome trace events."""
    events = list(events)
    gpu_pids = {pid: name for pid, name in process_names(events).items() if "GPU" in name}
    streams = {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in events
        if e.get("ph") == "M"
        and e.get("name") == "thread_name"
        and e.get("pid") in gpu_pids
        and str(e.get("args", {}).get("name", "")).startswith("Stream")
    }
    out: dict[str, list[Kernel]] = {name: [] for name in gpu_pids.values()}
    for e in events:
        stream = streams.get((e.get("pid"), e.get("tid")))
        if e.get("ph") != "X" or stream is None:
            continue
        start = float(e["ts"])
        out[gpu_pids[e["pid"]]].append(
            Kernel(e["name"], start, start + float(e["dur"]), stream, kernel_kind(e["name"]))
        )
    return {dev: sorted(ks, key=lambda k: k.start_us) for dev, ks in out.items() if ks}


def load_events(path: str) -> list[dict]:
    """The Chrome trace events of a `*.trace.json.gz` file, or of the newest one in a
    `jax.profiler.trace` log directory."""
    with gzip.open(path if os.path.isfile(path) else find_trace_file(path), "rt") as f:
        return json.load(f)["traceEvents"]


def load_kernels(log_dir: str) -> dict[str, list[Kernel]]:
    """`device_kernels` of the newest trace in `log_dir`."""
    return device_kernels(load_events(log_dir))


def jit_calls(events: Iterable[dict], steps: int) -> dict[str, dict[str, float]]:
    """The host's time in each jitted function's calls, per step: JAX's `PjitFunction(<name>)`
    events on host threads, which span the arguments' handling and, on a GPU, the launch of the
    program's kernels (synchronous in the calling thread). A call the trace records twice, one
    event inside another of the same name on the same thread, counts once."""
    events = list(events)
    devices = device_pids(events)
    calls = sorted(  # the outer of two events starting together first
        (e["pid"], e["tid"], e["name"], float(e["ts"]), -float(e["dur"]))
        for e in events
        if e.get("ph") == "X" and e.get("pid") not in devices
        and str(e.get("name", "")).startswith("PjitFunction(")
    )
    out: dict[str, dict[str, float]] = {}
    ends: dict[tuple, float] = {}
    for pid, tid, name, start, negative in calls:
        duration = -negative
        if start < ends.get((pid, tid, name), -1.0):
            continue  # inside a call already counted
        ends[(pid, tid, name)] = start + duration
        row = out.setdefault(name, {"calls_per_step": 0.0, "us_per_step": 0.0})
        row["calls_per_step"] += 1 / steps
        row["us_per_step"] += duration / steps
    return out


def union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted, disjoint intervals covering the same points as `intervals`."""
    merged: list[list[float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def length(intervals: Sequence[tuple[float, float]]) -> float:
    """Total length of disjoint intervals."""
    return sum(b - a for a, b in intervals)


def intersection(
    a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]]
) -> list[tuple[float, float]]:
    """Intersection of two sorted lists of disjoint intervals."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo < hi:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def summarize(kernels: Sequence[Kernel], steps: int) -> dict[str, float]:
    """Per-step figures (microseconds) of one device's kernels over `steps` traced steps.

    `span` runs from the first kernel's start to the last one's end; `idle` is the part of it in
    which no kernel runs; `compute` the part in which some compute kernel runs;
    `collective_overlapped` is collective time during which some compute kernel also runs,
    `collective_exposed` the rest. `busy_<kind>` sums kernel durations of each
    kind (streams may run kernels concurrently, so they can add up to more than the span).
    """
    if not kernels:
        raise ValueError("no kernels to summarize")
    span = max(k.end_us for k in kernels) - min(k.start_us for k in kernels)
    every = union((k.start_us, k.end_us) for k in kernels)
    compute = union((k.start_us, k.end_us) for k in kernels if k.kind != "collective")
    comm = union((k.start_us, k.end_us) for k in kernels if k.kind == "collective")
    overlapped = length(intersection(compute, comm))
    out = {
        "steps": steps,
        "span_us": span / steps,
        "idle_us": (span - length(every)) / steps,
        "compute_us": length(compute) / steps,
        "collective_us": length(comm) / steps,
        "collective_overlapped_us": overlapped / steps,
        "collective_exposed_us": (length(comm) - overlapped) / steps,
        "kernels_per_step": len(kernels) / steps,
    }
    for kind in ("collective", *COMPUTE_KINDS):
        out[f"busy_{kind}_us"] = (
            sum(k.end_us - k.start_us for k in kernels if k.kind == kind) / steps
        )
    return out


def busiest_stream(kernels: Sequence[Kernel]) -> str:
    """The stream with the most kernels (XLA's compute stream in a train step)."""
    counts = collections.Counter(k.stream for k in kernels)
    return max(counts, key=lambda s: (counts[s], s))


def after_first_step(kernels: Sequence[Kernel], steps: int) -> list[Kernel] | None:
    """The kernels of traced steps 2 to `steps`, each clipped to start no earlier than step 2.

    A trace starts after the steps before it are done, so its first step starts from an empty
    queue, and across processes each process's first step starts when its own trace has: the
    first collective waits for the last process to begin, exposed time no later step has. The
    busiest stream runs the same kernels every step, so its kernel `len / steps` opens step 2.
    None where `steps` < 2 or that stream's kernels do not split into `steps` alike (as many
    each, each opened by the same kernel)."""
    if steps < 2 or not kernels:
        return None
    stream = busiest_stream(kernels)
    own = sorted((k for k in kernels if k.stream == stream), key=lambda k: k.start_us)
    per_step = len(own) // steps
    if len(own) % steps or len({own[i * per_step].name for i in range(steps)}) > 1:
        return None
    start = own[per_step].start_us
    return [dataclasses.replace(k, start_us=max(k.start_us, start))
            for k in kernels if k.end_us > start]


def top_kernels(kernels: Sequence[Kernel], steps: int, n: int = 15) -> list[dict[str, object]]:
    """The `n` kernel names with the most total time per step, with counts per step."""
    totals: dict[str, list[float]] = {}
    for k in kernels:
        t = totals.setdefault(k.name, [0.0, 0])
        t[0] += k.end_us - k.start_us
        t[1] += 1
    ranked = sorted(totals.items(), key=lambda kv: -kv[1][0])[:n]
    return [
        {"name": name[:120], "us_per_step": t / steps, "count_per_step": c / steps}
        for name, (t, c) in ranked
    ]


# `idle_gaps`' size classes (µs): gaps shorter than 10, 10 to 100, 100 to 1,000, and longer.
GAP_BOUNDS_US = (10.0, 100.0, 1000.0)


def idle_gaps(kernels: Sequence[Kernel], steps: int, n: int = 10) -> dict[str, object]:
    """Where a device's idle time sits: the gaps between its busy intervals (any stream), per
    step by size class (`GAP_BOUNDS_US`), and the `n` longest with the activity that ended
    before each and the one that started after it. One long gap a step before the same kernel
    is the host dispatching the step late; many short ones inside it, kernels launched late."""
    busy = union((k.start_us, k.end_us) for k in kernels)
    gaps = [(b[0] - a[1], a[1], b[0]) for a, b in zip(busy, busy[1:])]
    names = ("lt_10us", "10_100us", "100_1000us", "ge_1000us")
    classes = {name: {"count_per_step": 0.0, "us_per_step": 0.0} for name in names}
    for gap, _, _ in gaps:
        name = names[sum(gap >= bound for bound in GAP_BOUNDS_US)]
        classes[name]["count_per_step"] += 1 / steps
        classes[name]["us_per_step"] += gap / steps
    ended = {k.end_us: k.name for k in sorted(kernels, key=lambda k: k.end_us)}
    started = {k.start_us: k.name for k in sorted(kernels, key=lambda k: -k.start_us)}
    longest = [
        {"us": gap, "after": ended[start][:120], "before": started[stop][:120]}
        for gap, start, stop in sorted(gaps, reverse=True)[:n]
    ]
    return {"classes": classes, "longest": longest}


# `stream_boundaries`: boundaries at least this long are waits (for the host, another stream or
# the next step), not one kernel following another.
BOUNDARY_BELOW_US = 10.0


def stream_boundaries(
    kernels: Sequence[Kernel], steps: int, below_us: float = BOUNDARY_BELOW_US
) -> dict[str, float | str | None]:
    """How the kernels of a device's busiest stream (XLA's compute stream in a train step)
    follow each other: the boundaries between consecutive kernels there, each the next one's
    start less the previous one's end, negative where the next started before the previous
    was seen to end. Of those shorter than `below_us`, per step: how many, how many negative,
    their sum, and their 10th, 50th and 90th percentiles; and the median of those at which
    another stream was busy (the previous kernel ended while a kernel or copy of another stream
    ran) and of the rest. A stream whose kernels follow each other later by the same amount
    whether or not another stream runs loses it at every boundary, not to what runs beside."""
    stream = busiest_stream(kernels)
    own = sorted((k for k in kernels if k.stream == stream), key=lambda k: k.start_us)
    others = union((k.start_us, k.end_us) for k in kernels if k.stream != stream)
    starts = [a for a, _ in others]
    beside, alone = [], []
    for a, b in zip(own, own[1:]):
        gap = b.start_us - a.end_us
        if gap < below_us:
            i = bisect.bisect_right(starts, a.end_us) - 1
            (beside if i >= 0 and a.end_us <= others[i][1] else alone).append(gap)
    gaps = sorted(beside + alone)

    def lower(values: list[float], q: float) -> float | None:  # numpy's "lower" percentile
        values = sorted(values)
        return values[int(q * (len(values) - 1))] if values else None

    return {
        "stream": stream,
        "count_per_step": len(gaps) / steps,
        "negative_per_step": sum(g < 0 for g in gaps) / steps,
        "sum_us_per_step": sum(gaps) / steps,
        "p10_us": lower(gaps, 0.1),
        "p50_us": lower(gaps, 0.5),
        "p90_us": lower(gaps, 0.9),
        "beside_other_per_step": len(beside) / steps,
        "p50_us_beside_other": lower(beside, 0.5),
        "p50_us_alone": lower(alone, 0.5),
    }


def dump_kernels(kernels: Sequence[Kernel]) -> dict[str, list]:
    """`kernels` compactly, for a file beside a summary: names once, then per kernel [name's
    index, stream, start µs, duration µs] (`undump_kernels` reads it)."""
    names: dict[str, int] = {}
    rows = [[names.setdefault(k.name, len(names)), k.stream, round(k.start_us, 3),
             round(k.end_us - k.start_us, 3)] for k in kernels]
    return {"names": list(names), "kernels": rows}


def undump_kernels(dump: dict[str, list]) -> list[Kernel]:
    """The kernels of a `dump_kernels` dump, sorted by start."""
    names = dump["names"]
    return sorted(
        (Kernel(names[i], start, start + duration, stream, kernel_kind(names[i]))
         for i, stream, start, duration in dump["kernels"]),
        key=lambda k: k.start_us,
    )


def device_summaries(
    events: Iterable[dict], steps: int, n: int = 15
) -> dict[str, dict[str, object]]:
    """Per GPU of a trace's events (`load_events`): `summarize`, `idle_gaps`, `top_kernels` and
    `stream_boundaries`."""
    return {
        device: {
            "per_step": summarize(kernels, steps),
            "gaps": idle_gaps(kernels, steps),
            "top": top_kernels(kernels, steps, n),
            "boundaries": stream_boundaries(kernels, steps),
        }
        for device, kernels in device_kernels(events).items()
    }
