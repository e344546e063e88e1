"""Held-out validation of the communication model: every benchmark row the calibration did not
use, predicted from the calibration alone (`jia_jax/comm_calibration.json`, written by
`scripts/calibrate_comm.py`), and the figures docs/scaling.md quotes about the errors.

Needs JAX (CPU is enough) for the models' parameter shapes.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import statistics
from collections.abc import Sequence
from typing import Any

from configs import default as default_config
from jia_jax import comm_model as cm
from scripts import calibrate_comm as cc


@dataclasses.dataclass(frozen=True)
class Shapes:
    """Gradient leaves of a model: element counts in backward and in tree order; BN stat count."""

    backward: tuple[int, ...]
    tree: tuple[int, ...]
    stats: int


@functools.cache
def model_shapes(
    name: str, width: int | None = None, small_inputs: bool = False, image_size: int = 224
) -> Shapes:
    """Abstract parameter shapes (no FLOPs) of a `jia_jax.models` classifier with 1000 classes."""
    import jax  # pylint: disable=import-outside-toplevel
    import jax.numpy as jnp  # pylint: disable=import-outside-toplevel

    from jia_jax import models  # pylint: disable=import-outside-toplevel
    from jia_jax.models import call_order  # pylint: disable=import-outside-toplevel

    overrides = {"width": width} if width else {}
    if small_inputs:
        overrides["small_inputs"] = True
    model = models.create_model(name, num_classes=1000, dtype=jnp.bfloat16, **overrides)
    shape = (image_size, image_size, 3)
    variables = jax.eval_shape(
        lambda k: model.init(k, jnp.zeros((1, *shape)), train=False), jax.random.key(0)
    )
    leaves = [math.prod(x.shape) for x in jax.tree.leaves(variables["params"])]
    order = call_order.backward_leaf_order(model, shape)
    stats = sum(math.prod(x.shape) for x in jax.tree.leaves(variables.get("batch_stats", {})))
    return Shapes(tuple(leaves[i] for i in order), tuple(leaves), stats)


# ---------------------------------------------------------------------------------------------
# Predictions of held-out rows


def row_model(row: cc.Row, cal: dict[str, Any]) -> cm.CommModel:
    """Every benchmark machine so far is one host: the node axis rides NVLink there."""
    hosts = row.environment.get("host_count", 1)
    return cm.load_model(cal, single_host=hosts == 1)


def predict_allreduce(row: cc.Row, model: cm.CommModel) -> float:
    """Predicted seconds of one bench_allreduce row."""
    d, args = row.data, row.doc_args
    node, gpu = row.mesh()
    if d["strategy"] in ("plain", "xla"):
        # `plain` is one psum of a flat buffer of the payload's bytes; `xla` is validated on flat
        # buffers only (one leaf: one all-reduce).
        return cm.allreduce_s(d["payload_bytes"], node, gpu, model)
    itemsize = cm.WIRE_ITEMSIZE[d["dtype"]]
    if d["payload"] == args.get("tree_model"):
        # bench_allreduce buckets the tree in reverse `tree_leaves` order (no leaf_order).
        sizes = list(reversed(model_shapes(d["payload"], args.get("model_width")).tree))
    else:
        sizes = [d["payload_bytes"] // itemsize]
    buckets = cm.bucket_elements(sizes, d["bucket_bytes"], itemsize)
    crossover = int(args.get("hybrid_crossover_mib", 4.0) * cc.MIB)
    return cm.plan_s(d["strategy"], buckets, itemsize, crossover, node, gpu, model)


def predict_step_comm(row: cc.Row, model: cm.CommModel) -> tuple[float, float]:
    """Predicted communication seconds of one multi-device bench_step row: (all of it, the part
    backward does not hide). The rows record no `comm.overlap`: the explicit strategies are taken
    with the config's default (on: `comm_model.exposed_s`), 'xla' without (all exposed); the
    running BN statistics are averaged after backward."""
    d, args = row.data, row.doc_args
    node, gpu = row.mesh()
    shapes = model_shapes(
        d["model"],
        args.get("model_width"),
        bool(args.get("small_inputs")),
        args.get("image_size", 224),
    )
    itemsize = cm.WIRE_ITEMSIZE[d["comm_dtype"]]
    # Running BN statistics and the two metrics are averaged in fp32 every step.
    stats_bytes = (shapes.stats + 2) * 4
    grad_bytes = sum(shapes.backward) * itemsize
    if d["strategy"] == "xla":
        count = d.get("collectives", {}).get("all-reduce", 1)
        total = cm.xla_s(grad_bytes + stats_bytes, count, node, gpu, model)
        return total, total
    crossover_mib = args.get("hybrid_crossover_mib")
    crossover = (
        default_config.get_config().comm.hybrid_crossover_bytes
        if crossover_mib is None
        else int(crossover_mib * cc.MIB)
    )
    buckets = cm.bucket_elements(shapes.backward, int(d["bucket_mib"] * cc.MIB), itemsize)
    times, exposed = cm.plan_reduction(
        d["strategy"], buckets, itemsize, crossover, node, gpu, model, model.overlap
    )
    stats = cm.allreduce_s(stats_bytes, node, gpu, model)
    return sum(times) + stats, exposed + stats


def validation(rows: Sequence[cc.Row], cal: dict[str, Any]) -> tuple[list[dict], list[dict]]:
    """(validated rows, rows that could not be validated) for every row not used to calibrate."""
    fitted = {r["row"] for r in cal["intra"]["rows"]}
    compute = {c["row"]: c for c in cal["compute"]}
    out, skipped = [], []
    for row in rows:
        reason = cc.exclusion_reason(row)
        if row.row_id in fitted or reason or row.row_id in compute:
            continue
        model = row_model(row, cal)
        entry = {"row": row, "measured_s": None}
        if row.kind == "allreduce":
            entry.update(measured_s=row.data["time_s"], predicted_s=predict_allreduce(row, model))
        else:
            base = [
                c
                for c in compute.values()
                if c["row"].split("#")[0] == row.file
                and c["model"] == row.data["model"]
                and c["per_device_batch"] == row.data["per_device_batch"]
            ]
            if not base:
                skipped.append({"row": row, "reason": "no 1x1 row of the same run for compute"})
                continue
            if row.data["strategy"] not in ("xla", *cm.STRATEGIES):
                reason = f"strategy {row.data['strategy']!r} with no resolved plan in the row"
                skipped.append({"row": row, "reason": reason})
                continue
            total, exposed = predict_step_comm(row, model)
            entry.update(
                measured_s=row.data["step_time_s"],
                predicted_s=cm.step_s(base[0]["step_time_s"], exposed, model, row.data["devices"]),
                compute_s=base[0]["step_time_s"],
                # What the step adds to compute (set against measured - compute).
                predicted_comm_s=exposed,
                predicted_total_comm_s=total,
            )
        entry["error"] = entry["predicted_s"] / entry["measured_s"] - 1
        out.append(entry)
    return out, skipped


# ---------------------------------------------------------------------------------------------
# Figures the doc's prose quotes (tests/test_docs.py recomputes them)


def validation_stats(entries: Sequence[dict]) -> dict[str, float]:
    """Median absolute errors: all rows, per kind, the communication part of the step rows."""
    errors = [abs(e["error"]) for e in entries]
    by_kind = {
        k: [abs(e["error"]) for e in entries if e["row"].kind == k] for k in ("allreduce", "step")
    }
    comm = [
        abs(e["predicted_comm_s"] / (e["measured_s"] - e["compute_s"]) - 1)
        for e in entries
        if "predicted_comm_s" in e
    ]
    return {
        "median": statistics.median(errors),
        "allreduce": statistics.median(by_kind["allreduce"]) if by_kind["allreduce"] else math.nan,
        "step": statistics.median(by_kind["step"]) if by_kind["step"] else math.nan,
        "step_comm": statistics.median(comm) if comm else math.nan,
        "within10": sum(x <= 0.10 for x in errors),
        "count": len(errors),
    }


def same_collective_spread(rows: Sequence[cc.Row]) -> list[float]:
    """|1 - t(2x2 plain) / t(1x4 plain)| per payload and dtype: on one host both are the same
    all-reduce over the same GPUs, so this is the measurements' own spread."""
    plain: dict[tuple, dict] = {}
    for r in rows:
        if r.kind == "allreduce" and r.data["strategy"] == "plain" and not cc.exclusion_reason(r):
            plain.setdefault((r.file, r.data["payload"], r.data["dtype"]), {})[r.mesh()] = r
    spread = []
    for meshes in plain.values():
        flat = [m for m in meshes if m[0] == 1]
        for m, r in meshes.items():
            if m[0] > 1 and flat:
                spread.append(abs(r.data["time_s"] / meshes[flat[0]].data["time_s"] - 1))
    return spread


def comm_residuals(entries: Sequence[dict]) -> dict[str, list[float]]:
    """Measured minus predicted communication seconds of the step rows, per model: a cost that
    does not depend on the plan points at per-leaf work outside the collectives."""
    by_model: dict[str, list[float]] = {}
    for e in entries:
        if "predicted_comm_s" in e and not e["row"].data.get("xla_flags"):
            extra = e["measured_s"] - e["compute_s"] - e["predicted_comm_s"]
            by_model.setdefault(e["row"].data["model"], []).append(extra)
    return by_model


def compact_ids(ids: Sequence[str]) -> str:
    """`file#results[0]`, `file#results[1]`, ... -> `file` results[0-1], grouped per file."""
    groups: dict[tuple[str, str], list[int]] = {}
    for row_id in ids:
        file, rest = row_id.split("#")
        section, index = rest.rstrip("]").split("[")
        groups.setdefault((os.path.basename(file), section), []).append(int(index))
    parts = []
    for (file, section), idx in groups.items():
        idx.sort()
        runs, start = [], idx[0]
        for a, b in zip(idx, idx[1:] + [None]):
            if b != a + 1:
                runs.append(f"{start}" if start == a else f"{start}–{a}")
                start = b
        parts.append(f"`{file}` {section}[{', '.join(runs)}]")
    return "; ".join(parts)


def bucket_pairs(entries: Sequence[dict]) -> list[dict[str, Any]]:
    """Step rows of one run, strategy, model and mesh at their smallest and largest bucket size:
    the measured and the predicted difference, i.e. what the extra collectives really cost."""
    groups: dict[tuple, list[dict]] = {}
    for e in entries:
        d = e["row"].data
        if e["row"].kind == "step" and d.get("bucket_mib") is not None and not d.get("xla_flags"):
            key = (e["row"].file, d["model"], d["mesh_shape"], d["strategy"])
            groups.setdefault(key, []).append(e)
    pairs = []
    for (file, model, mesh, strategy), group in sorted(groups.items()):
        if len(group) > 1:
            small, large = sorted(group, key=lambda e: e["row"].data["bucket_mib"])[
                :: len(group) - 1
            ]
            pairs.append(
                {
                    "file": os.path.basename(file),
                    "what": f"{model} {mesh} {strategy}",
                    "mib": (small["row"].data["bucket_mib"], large["row"].data["bucket_mib"]),
                    "measured_s": small["measured_s"] - large["measured_s"],
                    "predicted_s": small["predicted_s"] - large["predicted_s"],
                }
            )
    return pairs
