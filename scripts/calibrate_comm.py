r"""Fits the communication model (`jia_jax/comm_model.py`) to this repository's benchmark JSONs.

Reads the output of `scripts/bench/allreduce.py`, `scripts/bench/step.py` and
`scripts/bench/link.py`, and writes the
calibration the trainer loads (`jia_jax/comm_calibration.json`):

  * intra-node link (`launch_s`, `alpha_s`, `beta_bytes_per_s`): weighted least squares (relative
    error, non-negative parameters) of `launch + 2(n-1) alpha + 2(n-1)/n B / beta` on the `plain`
    rows (one psum of a flat buffer) of 1 x n meshes; only the device-timed ones where a file has
    them (`host_timed`). Where the rows span one GPU count only, launch and alpha cannot be told
    apart, and `launch_s` is held at NCCL's published base latency. With four or more buffer sizes
    in a file, every other size is held out for validation;
  * compute: every 1x1 row of a bench_step JSON (step time on one device, recorded as is);
  * two levels on one machine split into hosts (`emulated_hosts`, per NCCL setting of
    `scripts/bench/link.py`): intra-host and inter-host alpha, beta from the `gpu` and `node`
    axes of its rows (`fit_emulated_hosts`), read by `comm_model.load_emulated_hosts`;
  * inter-node fabrics and reference hardware: published figures (`FABRICS`, `REFERENCE_INTRA`,
    each with its source), until a multi-node run exists;
  * `overlap` and `step_overhead_s`: given on the command line with where they were measured
    (default 0: no overlap measured).

Rows are excluded with a stated reason (`exclusion_reason`): errors and skipped cases, and in
host-timed all-reduce files (the harness times back-to-back calls from Python) the rows whose time
is the host's dispatch, not the collective. Refit after new benchmarks with:

  python -m scripts.calibrate_comm docs/benchmarks/*.json
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


def fit_ring(
    n: np.ndarray,
    nbytes: np.ndarray,
    t: np.ndarray,
    launch: float | None = None,
    alpha: float | None = None,
) -> tuple[float, float, float]:
    """(launch, alpha, 1/beta) of `t = launch + 2(n-1) alpha + 2(n-1)/n B / beta`: least squares
    in relative error (each equation divided by its measured time), non-negative; a value given
    is held, the others fitted."""
    terms = {"launch": np.ones_like(t), "alpha": 2 * (n - 1), "inv_beta": 2 * (n - 1) / n * nbytes}
    held = {"launch": launch, "alpha": alpha}
    rhs = t - sum(v * terms[k] for k, v in held.items() if v is not None)
    free = [k for k in terms if held.get(k) is None]
    solution = _nonnegative_lstsq(np.stack([terms[k] for k in free], axis=1) / t[:, None], rhs / t)
    fitted = {**held, **dict(zip(free, map(float, solution)))}
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
                )
                for axis in ("gpu", "node", "both")
            )
    return points


def fit_emulated_hosts(
    points: Sequence[LinkPoint], reference_alpha: dict[str, tuple[float, str]]
) -> dict[str, Any]:
    """The two levels of one NCCL setting: `intra` from the `gpu` axis (NVLink inside a host),
    `inter` from the `node` axis (the sockets between hosts, every GPU of a host sending at once:
    each GPU's share, as `comm_model.hierarchical_s` uses it), each `fit_ring` with launch held at
    NCCL's base latency (each level has one rank count, where launch and alpha are not
    separable). With one size alpha is held at `reference_alpha[level]` and only beta fitted.
    The `both` rows (one flat all-reduce over every GPU) are predicted, not fitted."""
    fit: dict[str, Any] = {"launch_s": NCCL_BASE_LATENCY_S}
    for axis, level in (("gpu", "intra"), ("node", "inter")):
        mine = [p for p in points if p.axis == axis]
        n, nbytes, t = (
            np.array([getattr(p, k) for p in mine], float) for k in ("ranks", "nbytes", "time_s")
        )
        one_size = len(set(nbytes)) < 2
        held, source = reference_alpha[level] if one_size else (None, "fitted")
        _, alpha, inv_beta = fit_ring(n, nbytes, t, launch=NCCL_BASE_LATENCY_S, alpha=held)
        predicted = NCCL_BASE_LATENCY_S + 2 * (n - 1) * alpha + 2 * (n - 1) / n * nbytes * inv_beta
        fit[level] = {
            "alpha_s": alpha,
            "beta_bytes_per_s": 1 / inv_beta,
            "alpha_source": source,
            "rows": [
                {**_point(p), "fitted_s": float(f)} for p, f in zip(mine, predicted)
            ],
        }
    fit["both_axes"] = [_point(p) for p in points if p.axis == "both"]
    return fit


def _point(p: LinkPoint) -> dict[str, Any]:
    return {"row": p.row, "ranks": p.ranks, "payload_bytes": p.nbytes, "measured_s": p.time_s}


def emulated_hosts(points: Sequence[LinkPoint], intra_alpha_s: float) -> dict[str, Any]:
    """`fit_emulated_hosts` of every NCCL setting measured across emulated hosts."""
    reference = {
        "intra": (intra_alpha_s, "held at the intra-node fit of the all-reduce rows: one size"),
        "inter": (NCCL_NET_STEP_LATENCY_S, f"held: one size; {_NCCL_TUNING}, network, 9.6 us"),
    }
    variants = sorted({p.variant for p in points})
    return {
        v: fit_emulated_hosts([p for p in points if p.variant == v], reference) for v in variants
    }


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
) -> dict[str, Any]:
    """The calibration document for the given benchmark JSONs."""
    rows = load_rows(paths)
    fit_rows, held = calibration_split(rows)
    intra = fit_intra(fit_rows)
    links = link_points(paths)
    files = {os.path.join(REPO, r.file) for r in rows} | {
        os.path.join(REPO, p.row.split("#")[0]) for p in links
    }
    return {
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
    parser.add_argument("--step_overhead_s", type=float, default=0.0)
    parser.add_argument("--step_overhead_source", default="not fitted (0)")
    args = parser.parse_args(argv)
    paths = args.jsons or sorted(glob.glob(os.path.join(REPO, "docs", "benchmarks", "*.json")))
    doc = calibrate(
        paths, args.overlap, args.overlap_source, args.step_overhead_s, args.step_overhead_source
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
            for level in ("intra", "inter")
        )
        print(f"emulated hosts, {name}: {levels}")
    return doc


if __name__ == "__main__":
    main()
