r"""Fits the communication model (`jia_jax/comm_model.py`) to this repository's benchmark JSONs.

Reads the output of `scripts/bench/allreduce.py`, `scripts/bench/step.py`, `scripts/bench/link.py`
and `scripts/bench/overlap.py`, and writes the calibration the trainer loads
(`jia_jax/comm_calibration.json`):

  * intra-node link (`launch_s`, `alpha_s`, `beta_bytes_per_s`): weighted least squares (relative
    error, non-negative parameters) of `launch + 2(n-1) alpha + 2(n-1)/n B / beta` on the `plain`
    rows (one psum of a flat buffer) of 1 x n meshes; only the device-timed ones where a file has
    them (`host_timed`). Where the rows span one GPU count only, launch and alpha cannot be told
    apart, and `launch_s` is held at NCCL's published base latency. With four or more buffer sizes
    in a file, every other size is held out for validation;
  * compute: every 1x1 row of a bench_step JSON (step time on one device, recorded as is);
  * two levels on one machine split into hosts (`emulated_hosts`, per NCCL setting of
    `scripts/bench/link.py`): intra-host, inter-host and flat-ring network alpha, beta from the
    `gpu`, `node` and `both` axes of its rows (`fit_emulated_hosts`), read by
    `comm_model.load_emulated_hosts`. Each setting is fitted from one file, the one with the most
    sizes: a one-size file holds alpha at a reference, and two machines' loopback sockets differ;
  * inter-node fabrics and reference hardware: published figures (`FABRICS`, `REFERENCE_INTRA`,
    each with its source), until a multi-node run exists;
  * `overlap`: fitted on one step of the trainer on emulated hosts (`--overlap_row`, a row of a
    `scripts/bench/overlap.py` JSON: `plans`), or given on the command line with where it was
    measured (default 0: no overlap measured); every other such step row the model can predict is
    predicted with it (`plans`, held out) or excluded with a reason (`plans_excluded`);
  * `step_overhead_s`: given on the command line (default 0).

Rows are excluded with a stated reason (`exclusion_reason`): errors and skipped cases, and in
host-timed all-reduce files (the harness times back-to-back calls from Python) the rows whose time
is the host's dispatch, not the collective. Refit after new benchmarks with:

  python -m scripts.calibrate_comm docs/benchmarks/*.json \
      --overlap_row='docs/benchmarks/bench_plans_2x2_256_4xH200.json#results[1]'
  python -m scripts.render scaling:held_out   # and the other tables of docs/scaling.md
  python -m scripts.predict_scaling           # redraws docs/scaling.png
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import hashlib
import itertools
import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

MIB = 1 << 20
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(REPO, "jia_jax", "comm_calibration.json")
# Below this payload a host-timed call is bound by its dispatch: in bench_allreduce_4xH200.json
# every 1 MiB row takes 0.14-0.47 ms whatever the strategy, against ~0.05 ms the 16/256 MiB rows
# extrapolate to.
DISPATCH_BOUND_BYTES = 4 * MIB

_NCCL_TUNING = (
    "NCCL's tuning model, NVIDIA/nccl src/graph/tuning.cc (commit 01afd20a): per-step latency "
    "of the ring with the Simple protocol"
)
# Published figures; docs/scaling.md shows them with their sources (`scripts.render scaling:links`).
NCCL_BASE_LATENCY_S = 8.4e-6  # baseLat, ring / Simple, same file
NCCL_NET_STEP_LATENCY_S = 9.6e-6  # ring / Simple over the network, same file
# The NCCL setting of `scripts/launch_local.sh --hosts` among `scripts/bench/link.py`'s variants.
EMULATED_DEFAULT = "hosts_sockets_4x4"
FABRICS: dict[str, dict[str, Any]] = {
    "ndr400_per_gpu": {
        "description": "InfiniBand NDR, one 400 Gb/s NIC per GPU (8-GPU H100/H200 servers)",
        "alpha_s": NCCL_NET_STEP_LATENCY_S,
        "beta_bytes_per_s": 400e9 / 8,
        "algorithms": ["ring", "tree"],
        "source": (
            "400 Gb/s NDR line rate: NVIDIA MMA4Z00-NS transceiver overview "
            "(docs.nvidia.com/networking/display/800GMMA4Z00NS/Overview); one NIC per GPU: "
            "MLCommons inference v3.1, Dell XE9680 H100 system description ('8x 400Gb "
            f"Infiniband', 8 accelerators per node); latency: {_NCCL_TUNING}, network, 9.6 us"
        ),
    },
    "ndr400_per_node": {
        "description": "one 400 Gb/s NDR NIC per node of 8 GPUs (a thin network)",
        "alpha_s": NCCL_NET_STEP_LATENCY_S,
        "beta_bytes_per_s": 400e9 / 8 / 8,
        "algorithms": ["ring", "tree"],
        "source": "as ndr400_per_gpu, with one NIC shared by the 8 GPUs of a node",
    },
    "paper_100g_per_node": {
        "description": (
            "Jia et al.'s cluster as assumed here: 100 Gb/s per node of 8 GPUs, ring all-reduce "
            "only (the paper compares with NCCL's flat ring)"
        ),
        "alpha_s": NCCL_NET_STEP_LATENCY_S,
        "beta_bytes_per_s": 100e9 / 8 / 8,
        "algorithms": ["ring"],
        "source": (
            "assumption: a 100 Gb/s network per 8-GPU P40 node, not confirmed from the paper's "
            f"text (arXiv 1807.11205, sec. 5); {_NCCL_TUNING}"
        ),
    },
}
REFERENCE_INTRA: dict[str, dict[str, Any]] = {
    "pcie3_x16": {
        "description": "PCIe 3.0 x16 between the GPUs of a node (Tesla P40 servers)",
        "alpha_s": 5.7e-6,
        "beta_bytes_per_s": 8e9 * 16 * 128 / 130 / 8,
        "launch_s": NCCL_BASE_LATENCY_S,
        "source": (
            "PCIe 3.0: 8 GT/s per lane, 128b/130b encoding (PCI-SIG), x16, one direction; "
            f"{_NCCL_TUNING}, PCI, 5.7 us; base latency 8.4 us"
        ),
    },
}


@dataclasses.dataclass(frozen=True)
class Row:
    """One measured row of a benchmark JSON, with what identifies it."""

    file: str  # path relative to the repository root
    section: str  # "results", or "variants" (bench_step's XLA-flag re-runs)
    index: int  # position in that list
    kind: str  # "allreduce" or "step"
    data: dict[str, Any]
    doc_args: dict[str, Any]
    environment: dict[str, Any]

    @property
    def row_id(self) -> str:
        return f"{self.file}#{self.section}[{self.index}]"

    def mesh(self) -> tuple[int, int]:
        text = self.data["mesh"] if self.kind == "allreduce" else self.data["mesh_shape"]
        node, gpu = (int(v) for v in text.split("x"))
        return node, gpu

    def summary(self) -> str:
        d = self.data
        if self.kind == "allreduce":
            bucket = (
                "" if d.get("bucket_bytes") is None else f" bucket {d['bucket_bytes'] / MIB:g}M"
            )
            return f"{d['payload']} {d['dtype']} {d['mesh']} {d['strategy']}{bucket}"
        bucket = "" if d.get("bucket_mib") is None else f" bucket {d['bucket_mib']:g}M"
        flags = f" with {d['xla_flags']}" if d.get("xla_flags") else ""
        return f"{d['model']} {d.get('mesh_shape', d['mesh'])} {d['strategy']}{bucket}{flags}"


def relpath(path: str) -> str:
    return os.path.relpath(os.path.abspath(path), REPO)


def benchmark_kind(doc: dict[str, Any]) -> str | None:
    """ "allreduce" or "step" for a bench_allreduce / bench_step JSON, None for anything else."""
    results = doc.get("results") if isinstance(doc, dict) else None
    if not results or not isinstance(results, list):
        return None
    if "payload" in results[0]:
        return "allreduce"
    return "step" if "model" in results[0] and "strategy" in results[0] else None


def load_rows(paths: Sequence[str]) -> list[Row]:
    """Every result row of the bench_allreduce / bench_step JSONs among `paths`; other JSONs in
    the benchmark folder (e.g. the large-batch study) are skipped."""
    rows = []
    for path in paths:
        with open(path) as f:
            doc = json.load(f)
        kind = benchmark_kind(doc)
        if kind is None:
            continue
        for section in ("results", "variants"):
            rows.extend(
                Row(relpath(path), section, i, kind, r, doc.get("args", {}), doc["environment"])
                for i, r in enumerate(doc.get(section, []))
            )
    return rows


def host_timed(row: Row) -> bool:
    """Whether an all-reduce row's `time_s` was timed from the host (calls dispatched from Python).

    The first harness timed back-to-back calls. The current one (`--extra_iterations`) times the
    reduction repeated inside one program, so `time_s` is device time, and records the host-timed
    call next to it as `call_time_s`.
    """
    return "call_time_s" not in row.data and "extra_iterations" not in row.doc_args


def exclusion_reason(row: Row) -> str | None:
    """Why a row can neither calibrate nor validate the model, or None if it can."""
    d = row.data
    if "error" in d or "skipped" in d:
        return f"not measured ({d.get('error') or d.get('skipped')})"[:120]
    if row.kind == "allreduce":
        tree = d.get("leaves", 1) > 1 and d["strategy"] != "plain"  # `plain` is one flat buffer
        if host_timed(row) and tree:
            return (
                f"host-dispatch bound: {d['leaves']} leaves x "
                f"{row.environment.get('device_count')} devices passed as separate jit arguments "
                "and outputs; every strategy takes about the same time, several times one psum "
                "of the same bytes"
            )
        if host_timed(row) and d["payload_bytes"] < DISPATCH_BOUND_BYTES:
            return (
                f"host-dispatch bound: below {DISPATCH_BOUND_BYTES / MIB:g} MiB a host-timed call "
                "costs its dispatch, whatever the strategy"
            )
        if tree and d["strategy"] == "xla":
            return (
                f"'xla' on a tree of {d['leaves']} leaves: how XLA combined their all-reduces is "
                "not recorded in the row"
            )
        if d["time_s"] <= 0:
            return "non-positive device time: the timing noise exceeds the reduction"
    return None


def calibration_split(rows: Sequence[Row]) -> tuple[list[Row], list[Row]]:
    """(fit rows, held-out plain rows): `plain` flat-buffer rows on 1 x n meshes, alternate sizes
    held out where a file has four or more sizes.

    Device-timed rows, where there are any, are the only ones fitted: a host-timed time carries
    part of the host's dispatch, which would inflate the fitted latency; the host-timed plain rows
    are then validated like the others.
    """
    plain = [
        r
        for r in rows
        if r.kind == "allreduce"
        and r.data["strategy"] == "plain"
        and r.mesh()[0] == 1
        and exclusion_reason(r) is None
    ]
    device = [r for r in plain if not host_timed(r)]
    candidates = device or plain
    fit = []
    for file in sorted({r.file for r in candidates}):
        mine = [r for r in candidates if r.file == file]
        sizes = sorted({r.data["payload_bytes"] for r in mine})
        kept = set(sizes[::2]) if len(sizes) >= 4 else set(sizes)
        fit += [r for r in mine if r.data["payload_bytes"] in kept]
    held = [r for r in plain if r not in fit]
    return fit, held


def _nonnegative_lstsq(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Least squares with x >= 0, by trying every subset of free columns (a handful of them)."""
    best, best_cost = np.zeros(a.shape[1]), float(np.sum(b * b))
    for k in range(1, a.shape[1] + 1):
        for cols in itertools.combinations(range(a.shape[1]), k):
            sol, *_ = np.linalg.lstsq(a[:, cols], b, rcond=None)
            if np.any(sol < 0):
                continue
            x = np.zeros(a.shape[1])
            x[list(cols)] = sol
            cost = float(np.sum((a @ x - b) ** 2))
            if cost < best_cost:
                best, best_cost = x, cost
    return best


def fit_terms(
    terms: dict[str, np.ndarray], t: np.ndarray, held: dict[str, float | None]
) -> dict[str, float]:
    """Coefficients of `t = sum_k x_k terms[k]`: least squares in relative error (each equation
    divided by its measured time), non-negative; a coefficient given in `held` is held, the
    others fitted."""
    rhs = t - sum(v * terms[k] for k, v in held.items() if v is not None)
    free = [k for k in terms if held.get(k) is None]
    solution = _nonnegative_lstsq(np.stack([terms[k] for k in free], axis=1) / t[:, None], rhs / t)
    fitted = {k: v for k, v in held.items() if v is not None}
    return {**fitted, **dict(zip(free, map(float, solution)))}


def fit_ring(
    n: np.ndarray,
    nbytes: np.ndarray,
    t: np.ndarray,
    launch: float | None = None,
    alpha: float | None = None,
) -> tuple[float, float, float]:
    """(launch, alpha, 1/beta) of `t = launch + 2(n-1) alpha + 2(n-1)/n B / beta`: `fit_terms`,
    a value given is held, the others fitted."""
    terms = {"launch": np.ones_like(t), "alpha": 2 * (n - 1), "inv_beta": 2 * (n - 1) / n * nbytes}
    fitted = fit_terms(terms, t, {"launch": launch, "alpha": alpha})
    if fitted["inv_beta"] <= 0:
        raise ValueError("The fit found no bandwidth term; the rows need at least two sizes.")
    return fitted["launch"], fitted["alpha"], fitted["inv_beta"]


def fit_intra(rows: Sequence[Row]) -> dict[str, Any]:
    """Fits launch, alpha and 1/beta of `t = launch + steps alpha + volume / beta` (see module)."""
    if not rows:
        raise ValueError("No usable `plain` rows on a 1 x n mesh to fit the intra-node link.")
    n = np.array([r.mesh()[1] for r in rows], float)
    nbytes = np.array([r.data["payload_bytes"] for r in rows], float)
    t = np.array([r.data["time_s"] for r in rows], float)
    launch_fixed = len(set(n)) < 2
    launch, alpha, inv_beta = fit_ring(
        n, nbytes, t, launch=NCCL_BASE_LATENCY_S if launch_fixed else None
    )
    steps, volume = 2 * (n - 1), 2 * (n - 1) / n * nbytes
    predicted = launch + steps * alpha + volume * inv_beta
    return {
        "launch_s": float(launch),
        "alpha_s": float(alpha),
        "beta_bytes_per_s": float(1 / inv_beta),
        "launch_source": (
            "held at NCCL's published base latency (tuning model, ring / Simple): the rows span "
            "one GPU count, where launch and alpha are not separable"
            if launch_fixed
            else "fitted"
        ),
        "device_kinds": sorted({r.environment.get("device_kind", "?") for r in rows}),
        "rows": [
            {
                "row": r.row_id,
                "summary": r.summary(),
                "payload_bytes": r.data["payload_bytes"],
                "measured_s": r.data["time_s"],
                "fitted_s": float(p),
                "host_timed": host_timed(r),
            }
            for r, p in zip(rows, predicted)
        ],
    }


@dataclasses.dataclass(frozen=True)
class LinkPoint:
    """One timed all-reduce of a `scripts/bench/link.py` row: one axis of one NCCL setting."""

    row: str  # "<file>#results[i]"
    variant: str  # the NCCL setting
    axis: str  # "gpu" (inside a host), "node" (across hosts) or "both"
    ranks: int
    nbytes: int  # per GPU
    time_s: float
    hosts: int = 2  # the emulated machine: hosts x gpus_per_host
    gpus_per_host: int = 2
    device_kind: str = "?"

    @property
    def file(self) -> str:
        return self.row.split("#")[0]


def link_points(paths: Sequence[str]) -> list[LinkPoint]:
    """The timed all-reduces of the bench_link JSONs among `paths`, of settings where the
    processes are separate hosts to NCCL. Older runs timed one size, their `args.size_mib`."""
    points = []
    for path in paths:
        with open(path) as f:
            doc = json.load(f)
        args, results = doc.get("args", {}), doc.get("results")
        if "size_mib" not in args or not results or "variant" not in results[0]:
            continue
        sizes = args["size_mib"]
        one_size = int(sizes * MIB) // 4 * 4 if not isinstance(sizes, list) else None
        machine = {
            "hosts": args.get("hosts", 2),
            "gpus_per_host": args.get("gpus_per_host", 2),
            "device_kind": doc.get("environment", {}).get("device_kind", "?"),
        }
        for i, r in enumerate(results):
            if "error" in r or not r["settings"]["separate_hosts"]:
                continue
            points.extend(
                LinkPoint(
                    f"{relpath(path)}#results[{i}]",
                    r["variant"],
                    axis,
                    r[axis]["ranks"],
                    r.get("size_bytes", one_size),
                    r[axis]["time_s"],
                    **machine,
                )
                for axis in ("gpu", "node", "both")
            )
    return points


def _arrays(points: Sequence[LinkPoint]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ranks, bytes per GPU, seconds) of `points`."""
    n, nbytes, t = (
        np.array([getattr(p, k) for p in points], float) for k in ("ranks", "nbytes", "time_s")
    )
    return n, nbytes, t


def fit_emulated_hosts(
    points: Sequence[LinkPoint], reference_alpha: dict[str, tuple[float, str]]
) -> dict[str, Any]:
    """The levels of one NCCL setting, each a `fit_terms` of the ring all-reduce with launch held
    at NCCL's base latency (each level has one rank count, where launch and alpha are not
    separable):

      * `intra` from the `gpu` axis (NVLink inside a host);
      * `inter` from the `node` axis (the sockets between hosts, every GPU of a host sending at
        once: each GPU's share, as `comm_model.hierarchical_s` uses it);
      * `flat_inter` from the `both` axis (one flat all-reduce over every GPU: the ring's
        `2(node-1)` network steps and node bandwidth `gpu x beta`, as `comm_model.allreduce_s`
        uses it), its steps inside a host at `intra`'s alpha.

    With one size a level's alpha is held at `reference_alpha[level]` and only beta fitted."""
    fit: dict[str, Any] = {"launch_s": NCCL_BASE_LATENCY_S}
    launch = NCCL_BASE_LATENCY_S
    for axis, level in (("gpu", "intra"), ("node", "inter"), ("both", "flat_inter")):
        mine = [p for p in points if p.axis == axis]
        n, nbytes, t = _arrays(mine)
        one_size = len(set(nbytes)) < 2
        held, source = reference_alpha[level] if one_size else (None, "fitted")
        # The ring's members on the level's link: every rank on one level, the hosts on both.
        node = np.array([p.hosts for p in mine], float) if axis == "both" else n
        gpu = n / node
        terms = {
            "launch": np.ones_like(t),
            "intra_alpha": 2 * (n - 1) - 2 * (node - 1),  # steps inside a host: 0 on one level
            "alpha": 2 * (node - 1),
            "inv_beta": 2 * (n - 1) / n * nbytes / gpu,
        }
        intra_alpha = fit["intra"]["alpha_s"] if axis == "both" else 0.0
        x = fit_terms(terms, t, {"launch": launch, "intra_alpha": intra_alpha, "alpha": held})
        if x["inv_beta"] <= 0:
            raise ValueError(f"The {axis} rows gave no bandwidth term.")
        predicted = sum(x[k] * terms[k] for k in terms)
        fit[level] = {
            "alpha_s": x["alpha"],
            "beta_bytes_per_s": 1 / x["inv_beta"],
            "alpha_source": source,
            "rows": [{**_point(p), "fitted_s": float(f)} for p, f in zip(mine, predicted)],
        }
    return fit


def _point(p: LinkPoint) -> dict[str, Any]:
    return {"row": p.row, "ranks": p.ranks, "payload_bytes": p.nbytes, "measured_s": p.time_s}


def _one_machine(points: Sequence[LinkPoint]) -> tuple[list[LinkPoint], list[dict[str, str]]]:
    """The points of one file, the one with the most sizes (the latest name among equals), and
    why the others' are not fitted."""
    files = sorted({p.file for p in points})
    sizes = {f: len({p.nbytes for p in points if p.file == f}) for f in files}
    chosen = max(files, key=lambda f: (sizes[f], f))
    others = [
        {
            "file": f,
            "reason": (
                f"{sizes[f]} size(s) against {sizes[chosen]} in {chosen}: one file is fitted, the "
                "one with the most sizes (alpha and beta apart); the loopback sockets between "
                "emulated hosts are the machine's own, so files of two machines are not mixed"
            ),
        }
        for f in files
        if f != chosen
    ]
    return [p for p in points if p.file == chosen], others


def emulated_hosts(points: Sequence[LinkPoint], intra_alpha_s: float) -> dict[str, Any]:
    """`fit_emulated_hosts` of every NCCL setting measured across emulated hosts, each from one
    file (`_one_machine`)."""
    net = (NCCL_NET_STEP_LATENCY_S, f"held: one size; {_NCCL_TUNING}, network, 9.6 us")
    reference = {
        "intra": (intra_alpha_s, "held at the intra-node fit of the all-reduce rows: one size"),
        "inter": net,
        "flat_inter": net,
    }
    out = {}
    for variant in sorted({p.variant for p in points}):
        mine, others = _one_machine([p for p in points if p.variant == variant])
        first = mine[0]
        out[variant] = {
            "file": first.file,
            "device_kind": first.device_kind,
            "mesh": f"{first.hosts}x{first.gpus_per_host}",
            **fit_emulated_hosts(mine, reference),
            "not_fitted": others,
        }
    return out


@dataclasses.dataclass(frozen=True)
class StepRow:
    """A row of a `scripts/bench/overlap.py` JSON: the trainer's ResNet-50 64K step on
    `hosts` emulated hosts of `gpus_per_host` GPUs, and the one-GPU step of the same call."""

    row: str  # "<file>#results[i]"
    variant: str  # `scripts/bench/overlap.py`'s VARIANTS
    hosts: int
    gpus_per_host: int
    per_device_batch: int
    strategy: str  # flat, hierarchical, hybrid, xla, peer, or auto (its plan not recorded)
    bucket_bytes: int | None  # None: not recorded (older runs)
    step_time_s: float
    compute_s: float | None  # the 1x1 row of the same file and batch
    nccl: dict[str, str]  # the NCCL settings beyond the loopback network
    device_kind: str
    tiny: bool  # the CPU smoke model, not ResNet-50
    crossover_bytes: int | None = None  # hybrid's, where 'auto' resolved it; None: the config's
    first_bucket_bytes: int = 0  # the first bucket's limit (0: bucket_bytes; older runs: 0)
    last_bucket_bytes: int = 0  # the last bucket's limit (0: none; older runs: 0)
    told: str = ""  # what XLA's latency estimator was told of the network ("": nothing)


def step_rows(paths: Sequence[str]) -> list[StepRow]:
    """The multi-process rows of the `scripts/bench/overlap.py` JSONs among `paths`."""
    out = []
    for path in paths:
        with open(path) as f:
            doc = json.load(f)
        results = doc.get("results") if isinstance(doc, dict) else None
        if not results or not isinstance(results, list) or "layout" not in results[0]:
            continue
        args = doc.get("args", {})
        ok = [(i, r) for i, r in enumerate(results) if "error" not in r and "step_time_s" in r]
        one = {r["per_device_batch"]: r["step_time_s"] for _, r in ok if r["layout"] == "1x1"}
        for i, r in ok:
            if r["hosts"] < 2:
                continue
            plan = r.get("resolved", {})  # what 'auto' resolved to, where recorded
            out.append(
                StepRow(
                    f"{relpath(path)}#results[{i}]",
                    r["variant"],
                    r["hosts"],
                    r["gpus_per_host"],
                    r["per_device_batch"],
                    plan.get("strategy", r.get("strategy", "?")),
                    plan.get("bucket_bytes", r.get("bucket_bytes")),
                    r["step_time_s"],
                    one.get(r["per_device_batch"]),
                    args.get("nccl", {}),
                    doc.get("environment", {}).get("device_kind", "?"),
                    bool(args.get("tiny")),
                    plan.get("hybrid_crossover_bytes"),
                    r.get("first_bucket_bytes", 0),
                    r.get("last_bucket_bytes", 0),
                    r.get("told", ""),
                )
            )
    return out


def fit_overlap(exposed_s: float, times: Sequence[float], always_s: float) -> float:
    """The `overlap` that makes `comm_model.exposed_s(times, overlap) + always_s` equal a measured
    exposed time: `exposed = t_last + always + (1 - overlap) sum(t_rest)`, clipped to [0, 1]."""
    rest = sum(times[:-1])
    if rest <= 0:
        raise ValueError("One bucket: nothing runs under backward, the overlap is not defined.")
    return min(1.0, max(0.0, 1.0 - (exposed_s - times[-1] - always_s) / rest))


def _step_plan(row: StepRow, fit: dict[str, Any] | None) -> tuple[str, bool] | str:
    """(strategy, comm.overlap) of a row the model predicts, or why it predicts none."""
    from scripts.bench import overlap as bench  # pylint: disable=import-outside-toplevel

    options = bench.VARIANTS.get(row.variant)
    if fit is None:
        return "no emulated-host fit of the run's NCCL settings"
    if row.device_kind != fit["device_kind"]:
        kind = "no device kind recorded" if row.device_kind == "?" else row.device_kind
        return f"another machine ({kind}): the links were fitted on {fit['device_kind']}"
    if f"{row.hosts}x{row.gpus_per_host}" != fit["mesh"]:
        return f"layout {row.hosts}x{row.gpus_per_host}: the links were fitted on {fit['mesh']}"
    if row.tiny:
        return "the CPU smoke model, not ResNet-50"
    if row.bucket_bytes is None:
        return "the row records no bucket size"
    if options is None:
        return f"variant {row.variant!r}: no longer in scripts/bench/overlap.py, its config unknown"
    if "xla" in options or "pgle" in options:
        return "XLA options change the schedule the overlap was fitted on"
    if row.told:
        return "XLA's estimator told the network: another schedule than the overlap was fitted on"
    if row.strategy == "peer":  # its own buckets (leaves in reverse tree order), one psum each
        return "flat", False
    if row.strategy not in ("flat", "hierarchical", "hybrid"):
        return {
            "xla": "'xla': XLA's own all-reduces, not planned by the model",
            "auto": "'auto': the plan it resolved to is not recorded in the row",
        }.get(row.strategy, f"strategy {row.strategy!r}")
    if row.compute_s is None:
        return "no 1x1 row of the same run for compute"
    return row.strategy, bool(options.get("comm.overlap", True))


def _step_setting(row: StepRow) -> str | None:
    """The `scripts/bench/link.py` NCCL setting the row's processes ran with."""
    from scripts.bench import link  # pylint: disable=import-outside-toplevel

    return next(
        (n for n, (separate, extra) in link.VARIANTS.items() if separate and extra == row.nccl),
        None,
    )


def _step_comm(row: StepRow, strategy: str, overlaps: bool, model: Any) -> dict[str, Any]:
    """Per-bucket times, the statistics' all-reduce and the exposed time of a row's plan:
    ResNet-50's gradient leaves in backward order (the peer: reverse tree order) packed into the
    row's buckets in the 64K config's wire dtype (hybrid: the row's crossover, else the
    config's); `model` is a `comm_model.CommModel`."""
    from configs import resnet50_64k  # pylint: disable=import-outside-toplevel
    from jia_jax import comm_model as cm  # pylint: disable=import-outside-toplevel
    from scripts.validate_comm import model_shapes  # pylint: disable=import-outside-toplevel

    comm = resnet50_64k.get_config().comm
    itemsize = cm.WIRE_ITEMSIZE[comm.dtype]
    shapes = model_shapes("resnet50")
    sizes = shapes.tree[::-1] if row.strategy == "peer" else shapes.backward
    node, gpu = row.hosts, row.gpus_per_host
    buckets = cm.bucket_elements(
        sizes, row.bucket_bytes, itemsize, row.first_bucket_bytes, row.last_bucket_bytes
    )
    crossover = comm.hybrid_crossover_bytes if row.crossover_bytes is None else row.crossover_bytes
    overlap = model.overlap if overlaps else 0.0
    times, exposed = cm.plan_reduction(
        strategy, buckets, itemsize, crossover, node, gpu, model, overlap
    )
    # Running BN statistics and two metrics, averaged in fp32 after backward.
    stats = cm.allreduce_s((shapes.stats + 2) * 4, node, gpu, model)
    return {"times": times, "stats_s": stats, "exposed_s": exposed + stats}


def _fitted_overlap(usable: Sequence[tuple], cal: dict[str, Any], row_id: str) -> dict[str, Any]:
    """The calibration's `overlap` entry fitted on the overlapped row `row_id` (`fit_overlap`)."""
    from jia_jax import comm_model as cm  # pylint: disable=import-outside-toplevel

    found = [u for u in usable if u[0].row == row_id and u[3]]
    if not found:
        raise ValueError(f"overlap row {row_id!r}: not an overlapped row the model predicts.")
    row, setting, strategy, _ = found[0]
    model = cm.load_emulated_hosts(cal, setting)
    p = _step_comm(row, strategy, False, model)
    measured = row.step_time_s - row.compute_s - model.step_overhead_s
    return {
        "value": fit_overlap(measured, p["times"], p["stats_s"]),
        "source": (
            f"{row.row} ({row.variant}, {strategy} {row.bucket_bytes / MIB:g} MiB, "
            f"{row.hosts}x{row.gpus_per_host}, {row.per_device_batch} per GPU): its step less the "
            "one-GPU step of the same call is t(last bucket) + (1 - overlap) t(others) + the "
            f"statistics' all-reduce on the {setting} links"
        ),
        "row": row.row,
    }


def plans(
    rows: Sequence[StepRow], cal: dict[str, Any], overlap_row: str | None
) -> dict[str, Any]:
    """The overlap fitted on `overlap_row` (if given; else the calibration's), and every row
    predicted with it from its one-GPU step and its plan on the emulated-host links of its NCCL
    setting: compute + `_step_comm`'s exposed time + overhead."""
    from jia_jax import comm_model as cm  # pylint: disable=import-outside-toplevel

    usable, excluded = [], []
    for row in rows:
        setting = _step_setting(row)
        plan = _step_plan(row, cal["emulated_hosts"].get(setting))
        if isinstance(plan, str):
            excluded.append({"row": row.row, "variant": row.variant, "reason": plan})
        else:
            usable.append((row, setting, *plan))
    overlap = cal["overlap"] if overlap_row is None else _fitted_overlap(usable, cal, overlap_row)
    with_overlap = {**cal, "overlap": overlap}
    entries = []
    for row, setting, strategy, overlaps in usable:
        model = cm.load_emulated_hosts(with_overlap, setting)
        p = _step_comm(row, strategy, overlaps, model)
        predicted = cm.step_s(row.compute_s, p["exposed_s"], model, row.hosts * row.gpus_per_host)
        entries.append(
            {
                "row": row.row,
                "variant": row.variant,
                "setting": setting,
                "per_device_batch": row.per_device_batch,
                "strategy": strategy,
                "bucket_bytes": row.bucket_bytes,
                "overlap": overlaps,
                "buckets": len(p["times"]),
                "compute_s": row.compute_s,
                "measured_s": row.step_time_s,
                "predicted_s": predicted,
                "predicted_exposed_s": p["exposed_s"],
                "error": predicted / row.step_time_s - 1,
                "fitted": row.row == overlap.get("row"),
            }
        )
    return {"overlap": overlap, "plans": entries, "plans_excluded": excluded}


def compute_rows(rows: Sequence[Row]) -> list[dict[str, Any]]:
    """The measured one-device step times (bench_step 1x1 rows)."""
    return [
        {
            "row": r.row_id,
            "device_kind": r.environment.get("device_kind", "?"),
            "model": r.data["model"],
            "per_device_batch": r.data["per_device_batch"],
            "compute_dtype": r.doc_args.get("compute_dtype"),
            "step_time_s": r.data["step_time_s"],
        }
        for r in rows
        if r.kind == "step" and r.data.get("devices") == 1 and exclusion_reason(r) is None
    ]


def file_digest(path: str) -> str:
    with open(os.path.join(REPO, path), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:16]


def calibrate(
    paths: Sequence[str],
    overlap: float,
    overlap_source: str,
    overhead_s: float,
    overhead_source: str,
    overlap_row: str | None = None,
) -> dict[str, Any]:
    """The calibration document for the given benchmark JSONs; with `overlap_row` (a row id of a
    `scripts/bench/overlap.py` JSON among them) the overlap is fitted on that row instead of
    given (`plans`)."""
    rows = load_rows(paths)
    fit_rows, held = calibration_split(rows)
    intra = fit_intra(fit_rows)
    links = link_points(paths)
    steps = step_rows(paths)
    files = (
        {os.path.join(REPO, r.file) for r in rows}
        | {os.path.join(REPO, p.file) for p in links}
        | {os.path.join(REPO, r.row.split("#")[0]) for r in steps}
    )
    doc = {
        "format": 1,
        "intra": intra,
        "held_out_plain": [r.row_id for r in held],
        "excluded": [
            {"row": r.row_id, "summary": r.summary(), "reason": exclusion_reason(r)}
            for r in rows
            if exclusion_reason(r)
        ],
        "compute": compute_rows(rows),
        "files": [
            {"path": relpath(p), "sha256_16": file_digest(relpath(p))} for p in sorted(files)
        ],
        "fabrics": FABRICS,
        "default_fabric": "ndr400_per_gpu",
        # Two hosts' worth of links measured on one machine (`scripts/bench/link.py`).
        "emulated_hosts": emulated_hosts(links, intra["alpha_s"]),
        "default_emulated": EMULATED_DEFAULT,
        "reference_intra": REFERENCE_INTRA,
        "overlap": {"value": overlap, "source": overlap_source},
        "step_overhead_s": {"value": overhead_s, "source": overhead_source},
    }
    if steps or overlap_row:
        # Emulated hosts' steps, predicted as held-out rows (but the overlap's own).
        doc.update(plans(steps, doc, overlap_row))
    return doc


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "jsons", nargs="*", help="benchmark JSONs (default: docs/benchmarks/*.json)"
    )
    parser.add_argument("--out", default=DEFAULT_OUT)
    parser.add_argument(
        "--overlap",
        type=float,
        default=0.0,
        help="measured fraction of the communication hidden behind backward",
    )
    parser.add_argument(
        "--overlap_source",
        default="not measured yet: 0 until a profile shows collectives running during backward",
    )
    parser.add_argument(
        "--overlap_row",
        help=(
            "fit the overlap on this row of a scripts/bench/overlap.py JSON (<file>#results[i]) "
            "instead of --overlap"
        ),
    )
    parser.add_argument("--step_overhead_s", type=float, default=0.0)
    parser.add_argument("--step_overhead_source", default="not fitted (0)")
    args = parser.parse_args(argv)
    paths = args.jsons or sorted(glob.glob(os.path.join(REPO, "docs", "benchmarks", "*.json")))
    doc = calibrate(
        paths,
        args.overlap,
        args.overlap_source,
        args.step_overhead_s,
        args.step_overhead_source,
        args.overlap_row,
    )
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    intra = doc["intra"]
    print(
        f"intra-node: launch {intra['launch_s'] * 1e6:.1f} us, "
        f"alpha {intra['alpha_s'] * 1e6:.2f} us,"
        f" beta {intra['beta_bytes_per_s'] / 1e9:.1f} GB/s from {len(intra['rows'])} rows; "
        f"{len(doc['excluded'])} rows excluded; wrote {relpath(args.out)}"
    )
    for name, fit in doc["emulated_hosts"].items():
        levels = ", ".join(
            f"{level} alpha {fit[level]['alpha_s'] * 1e6:.1f} us"
            f"{'' if fit[level]['alpha_source'] == 'fitted' else ' (held)'}"
            f" beta {fit[level]['beta_bytes_per_s'] / 1e9:.2f} GB/s"
            for level in ("intra", "inter", "flat_inter")
        )
        print(f"emulated hosts, {name}: {levels}")
    print(f"overlap {doc['overlap']['value']:.3f}: {doc['overlap']['source']}")
    for e in doc.get("plans", []):
        print(
            f"{e['row']} {e['variant']} {e['per_device_batch']}: {e['strategy']} "
            f"{e['bucket_bytes'] / MIB:g} MiB measured {e['measured_s'] * 1e3:.2f} ms, predicted "
            f"{e['predicted_s'] * 1e3:.2f} ms ({e['error']:+.1%}){' (fitted)' * e['fitted']}"
        )
    return doc


if __name__ == "__main__":
    main()
