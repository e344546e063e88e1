r"""Renders `docs/scaling.md` and `docs/scaling.png`: the communication model against the measured
benchmarks, and its weak-scaling predictions to 2,048 GPUs next to Jia et al.'s reported results.

Every number in the doc comes from here: the calibration (`jia_jax/comm_calibration.json`, from
`scripts/calibrate_comm.py`), the raw benchmark JSONs in `docs/benchmarks/`, the published
figures that `calibrate_comm.py` records with their sources, and the paper's results (`PAPER`).

  python -m scripts.calibrate_comm docs/benchmarks/*.json
  python -m scripts.predict_scaling

Needs JAX (CPU is enough) for the models' parameter shapes, and matplotlib for the plot.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import glob
import itertools
import json
import math
import os
import statistics
import types
from collections.abc import Sequence
from typing import Any

from configs import default as default_config
from jia_jax import comm_model as cm
from scripts import calibrate_comm as cc

IMAGENET_TRAIN_IMAGES = 1_281_167
GLOBAL_BATCH = 65536
GPUS_PER_NODE = 8
GPU_COUNTS = tuple(8 << k for k in range(9))  # 8 ... 2048
MODELS = {"resnet50": "ResNet-50", "alexnet_bn": "AlexNet-BN"}
WIRE = "float32"  # comm.dtype of the 64K configs
# Jia et al. 2018 (arXiv 1807.11205), as /work/shared/PAPER_NOTES.md and the abstract report them.
PAPER = {
    "resnet50": {"gpus": 2048, "epochs": 90, "minutes": 6.6, "speedup_vs_nccl": 11},
    "alexnet_bn": {"gpus": 1024, "epochs": 95, "minutes": 4.0, "speedup_vs_nccl": 3},
    "speedup_gpus": 1024,
    "p40_resnet50_images_per_s": 218,  # one P40, mixed precision
    "source": (
        "arXiv 1807.11205: abstract and mixed-precision section, as summarised in "
        "/work/shared/PAPER_NOTES.md; the AlexNet GPU count from the authors' GTC talk S9146 "
        "(developer.nvidia.com/gtc/2019/video/S9146)"
    ),
}
PAPER_WIRE = "float16"  # assumed: the paper trains in FP16 and fuses FP16 gradients


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
# Held-out validation


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


def predict_step_comm(row: cc.Row, model: cm.CommModel) -> float:
    """Predicted communication seconds of one multi-device bench_step row."""
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
        return cm.xla_s(grad_bytes + stats_bytes, count, node, gpu, model)
    crossover_mib = args.get("hybrid_crossover_mib")
    crossover = (
        default_config.get_config().comm.hybrid_crossover_bytes
        if crossover_mib is None
        else int(crossover_mib * cc.MIB)
    )
    buckets = cm.bucket_elements(shapes.backward, int(d["bucket_mib"] * cc.MIB), itemsize)
    comm = cm.plan_s(d["strategy"], buckets, itemsize, crossover, node, gpu, model)
    return comm + cm.allreduce_s(stats_bytes, node, gpu, model)


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
            comm = predict_step_comm(row, model)
            entry.update(
                measured_s=row.data["step_time_s"],
                predicted_s=cm.step_s(base[0]["step_time_s"], comm, model, row.data["devices"]),
                compute_s=base[0]["step_time_s"],
                predicted_comm_s=comm,
            )
        entry["error"] = entry["predicted_s"] / entry["measured_s"] - 1
        out.append(entry)
    return out, skipped


# ---------------------------------------------------------------------------------------------
# Scaling predictions


def compute_per_image(cal: dict[str, Any], model: str, device_kind: str) -> tuple[float, list[str]]:
    """Median measured one-device seconds per image of a model on a device kind, and its rows."""
    rows = [c for c in cal["compute"] if c["model"] == model and c["device_kind"] == device_kind]
    if not rows:
        raise ValueError(f"No 1x1 bench_step row of {model} on {device_kind} in the calibration.")
    per_image = statistics.median(c["step_time_s"] / c["per_device_batch"] for c in rows)
    return per_image, [c["row"] for c in rows]


def best_plan(
    strategy: str,
    node: int,
    gpu: int,
    shapes: Shapes,
    wire: str,
    model: cm.CommModel,
    compute_s: float,
) -> cm.Plan:
    """The strategy's best bucket (and crossover) from `comm_model.resolve`'s grid."""
    comm = types.SimpleNamespace(
        strategy=strategy,
        bucket_bytes=cm.AUTO_BYTES,
        hybrid_crossover_bytes=cm.AUTO_BYTES,
        dtype=wire,
    )
    return cm.resolve(
        comm, node=node, gpu=gpu, leaf_sizes=shapes.backward, compute_s=compute_s, model=model
    )


def scaling_rows(
    model_name: str,
    model: cm.CommModel,
    per_image_s: float,
    wire: str,
    counts: Sequence[int] = GPU_COUNTS,
) -> list[dict[str, Any]]:
    """Predicted step, efficiency and epoch time at 64K for every GPU count and strategy."""
    shapes = model_shapes(model_name)
    out = []
    for gpus in counts:
        per_gpu = GLOBAL_BATCH // gpus
        compute = per_image_s * per_gpu
        node, gpu = max(1, gpus // GPUS_PER_NODE), min(gpus, GPUS_PER_NODE)
        entry = {"gpus": gpus, "nodes": node, "per_gpu": per_gpu, "compute_s": compute}
        for strategy in cm.STRATEGIES:
            plan = best_plan(strategy, node, gpu, shapes, wire, model, compute)
            entry[strategy] = {
                "plan": plan,
                "efficiency": compute / plan.step_s,
                "epoch_s": IMAGENET_TRAIN_IMAGES / GLOBAL_BATCH * plan.step_s,
            }
        entry["auto"] = best_plan(cm.AUTO, node, gpu, shapes, wire, model, compute).strategy
        out.append(entry)
    return out


def paper_model(cal: dict[str, Any]) -> cm.CommModel:
    """The paper's cluster as assumed: P40s on PCIe 3.0, 100 Gb/s per node, ring only."""
    intra = cal["reference_intra"]["pcie3_x16"]
    model = cm.load_model(cal, fabric="paper_100g_per_node")
    return dataclasses.replace(
        model,
        intra=cm.Link(intra["alpha_s"], intra["beta_bytes_per_s"]),
        launch_s=intra["launch_s"],
        overlap=0.0,
        step_overhead_s=0.0,
    )


def paper_comparison(cal: dict[str, Any]) -> dict[str, Any]:
    """The model on the paper's hardware, next to what the paper reports."""
    model = paper_model(cal)
    itemsize = cm.WIRE_ITEMSIZE[PAPER_WIRE]
    steps = IMAGENET_TRAIN_IMAGES / GLOBAL_BATCH
    out: dict[str, Any] = {}
    for name in MODELS:
        reported = PAPER[name]
        gpus = reported["gpus"]
        shapes = model_shapes(name)
        plans = {
            s: best_plan(s, gpus // GPUS_PER_NODE, GPUS_PER_NODE, shapes, PAPER_WIRE, model, 0.0)
            for s in cm.STRATEGIES
        }
        best = min(plans.values(), key=lambda p: p.comm_s)
        epoch_reported = reported["minutes"] * 60 / reported["epochs"]
        # The paper's all-reduce speed-up over NCCL-based training, at `speedup_gpus`: its own
        # scheme (hybrid, fused) against a flat ring of every tensor, and of fused buckets.
        node = PAPER["speedup_gpus"] // GPUS_PER_NODE
        ours = best_plan("hybrid", node, GPUS_PER_NODE, shapes, PAPER_WIRE, model, 0.0)
        per_leaf = cm.bucket_elements(shapes.backward, 0, itemsize)
        fused = cm.bucket_elements(shapes.backward, ours.bucket_bytes, itemsize)
        ring = (itemsize, 0, node, GPUS_PER_NODE, model)
        entry = {
            "gpus": gpus,
            "plans": plans,
            "best": best,
            "epoch_reported_s": epoch_reported,
            "comm_epoch_s": best.comm_s * steps,
            "speedup_per_leaf": cm.plan_s("flat", per_leaf, *ring) / ours.comm_s,
            "speedup_fused": cm.plan_s("flat", fused, *ring) / ours.comm_s,
        }
        if name == "resnet50":
            compute = GLOBAL_BATCH / gpus / PAPER["p40_resnet50_images_per_s"]
            entry["compute_s"] = compute
            entry["epoch_predicted_s"] = (compute + best.comm_s) * steps
            entry["efficiency_predicted"] = compute / (compute + best.comm_s)
            entry["efficiency_reported"] = (
                IMAGENET_TRAIN_IMAGES / epoch_reported / gpus / PAPER["p40_resnet50_images_per_s"]
            )
        out[name] = entry
    return out


# ---------------------------------------------------------------------------------------------
# Rendering

MODEL_TEXT = """## The model (`jia_jax/comm_model.py`)

Per link level (inside a node: NVLink or PCIe; across nodes: the network) three quantities:
`launch` (fixed cost of one collective: kernel launch and NCCL's base latency), `alpha` (latency
of one ring step on that level) and `beta` (bandwidth one GPU gets on that level; for the network,
the GPU's share of its node's NICs). For B bytes per GPU (wire dtype x elements):

- ring all-reduce over n GPUs: `launch + 2(n-1) alpha + 2(n-1)/n B / beta`; across N nodes of G
  GPUs, `2(N-1)` of the steps are on the network (NCCL's own tuning model), and the bandwidth is
  the slower of NVLink and the node's share of the network (`G beta_net`);
- tree all-reduce (NCCL's alternative, used where the fabric lists it):
  `launch + 2((G-1) alpha_intra + ceil(log2 N) alpha_net) + 2 B / beta`; the faster one counts;
- reduce-scatter or all-gather over n GPUs: `launch + (n-1) alpha + (n-1)/n B / beta`;
- `flat` = one all-reduce per bucket over all GPUs; `hierarchical` = reduce-scatter over the G
  GPUs of a node, G concurrent all-reduces of B/G bytes over the N nodes (each with one GPU's
  share of the NICs), all-gather over G (with N or G = 1: one all-reduce over the other level, as
  `allreduce._hierarchical_sum` does); `hybrid` = hierarchical below the crossover, flat above;
- buckets: the greedy packing of `allreduce.plan_buckets` on the leaves in backward order
  (`comm_model.bucket_elements`, tested against it);
- step = compute (a measured one-device step) + (1 - overlap) x communication + fixed overhead;
  weak-scaling efficiency = compute / step.
"""


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}" if seconds < 0.01 else f"{seconds * 1e3:.1f}"


def pct(x: float) -> str:
    return f"{x * 100:+.1f}%"


def table(header: Sequence[str], rows: Sequence[Sequence[Any]], right: Sequence[int] = ()) -> str:
    """A Markdown table; columns in `right` are right-aligned."""
    align = ["---:" if i in right else "---" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def render_calibration(cal: dict[str, Any]) -> str:
    intra = cal["intra"]
    fit = table(
        ["row", "what", "measured ms", "fitted ms", "error"],
        [
            (
                f"`{r['row']}`",
                r["summary"],
                ms(r["measured_s"]),
                ms(r["fitted_s"]),
                pct(r["fitted_s"] / r["measured_s"] - 1),
            )
            for r in intra["rows"]
        ],
        right=(2, 3, 4),
    )
    fabrics = table(
        ["name", "what", "alpha us", "beta GB/s per GPU", "algorithms", "source"],
        [
            (
                f"`{k}`",
                f["description"],
                f"{f['alpha_s'] * 1e6:.1f}",
                f"{f['beta_bytes_per_s'] / 1e9:.3g}",
                ", ".join(f["algorithms"]),
                f["source"],
            )
            for k, f in cal["fabrics"].items()
        ]
        + [
            (
                f"`{k}` (inside a node)",
                f["description"],
                f"{f['alpha_s'] * 1e6:.1f}",
                f"{f['beta_bytes_per_s'] / 1e9:.3g}",
                "ring",
                f["source"],
            )
            for k, f in cal["reference_intra"].items()
        ],
        right=(2, 3),
    )
    files = ", ".join(f"`{f['path']}` (sha256 {f['sha256_16']}…)" for f in cal["files"])
    return f"""## Calibration

`python -m scripts.calibrate_comm` read {files} and wrote `jia_jax/comm_calibration.json`.

**Inside a node** (fitted on {", ".join(intra["device_kinds"])}): launch
{intra["launch_s"] * 1e6:.1f} us per collective ({intra["launch_source"]}), alpha
{intra["alpha_s"] * 1e6:.2f} us per ring step, beta {intra["beta_bytes_per_s"] / 1e9:.1f} GB/s per
GPU, by weighted least squares (relative error, non-negative) on these `plain` rows (one `psum` of
a flat buffer on a 1 x n mesh):

{fit}

**Across nodes** no run exists yet, so the network is described by published figures (nominal line
rates: what NCCL achieves is somewhat lower, which makes these predictions optimistic):

{fabrics}

**Overlap** of communication with backward: {cal["overlap"]["value"]:g}
({cal["overlap"]["source"]}). **Fixed per-step overhead**: {cal["step_overhead_s"]["value"]:g} s
({cal["step_overhead_s"]["source"]}).
"""


def same_collective_spread(rows: Sequence[cc.Row]) -> list[float]:
    """|1 - t(2x2 plain) / t(1x4 plain)| per payload and dtype: on one host both are the same
    all-reduce over the same GPUs, so this is the measurements' own spread."""
    plain = {}
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


def render_validation(
    entries: list[dict], skipped: list[dict], rows: Sequence[cc.Row], cal: dict[str, Any]
) -> tuple[str, dict[str, float]]:
    body = []
    for i, e in enumerate(entries, 1):
        r = e["row"]
        comm = ""
        if "predicted_comm_s" in e:
            comm = f"{ms(e['measured_s'] - e['compute_s'])} / {ms(e['predicted_comm_s'])}"
        body.append(
            (
                i,
                f"`{os.path.basename(r.file)}` {r.section}[{r.index}]",
                r.summary(),
                ms(e["measured_s"]),
                ms(e["predicted_s"]),
                pct(e["error"]),
                comm,
            )
        )
    errors = [abs(e["error"]) for e in entries]
    by_kind = {
        k: [abs(e["error"]) for e in entries if e["row"].kind == k] for k in ("allreduce", "step")
    }
    comm_err = [
        abs(e["predicted_comm_s"] / (e["measured_s"] - e["compute_s"]) - 1)
        for e in entries
        if "predicted_comm_s" in e
    ]
    stats = {
        "median": statistics.median(errors),
        "allreduce": statistics.median(by_kind["allreduce"]) if by_kind["allreduce"] else math.nan,
        "step": statistics.median(by_kind["step"]) if by_kind["step"] else math.nan,
        "step_comm": statistics.median(comm_err) if comm_err else math.nan,
        "within10": sum(x <= 0.10 for x in errors),
        "count": len(errors),
    }
    skipped_text = "".join(
        f"\n- `{s['row'].row_id}` ({s['row'].summary()}): {s['reason']}" for s in skipped
    )
    return (
        f"""## Held-out validation

Every measured row of `docs/benchmarks/*.json` that the fit did not use and that is not excluded
below, predicted from the calibration alone. All-reduce rows: the collective's time. Step rows:
the 1x1 step of the same run (compute) plus the predicted reduction (gradients with the row's
strategy, bucket size, wire dtype and mesh, plus the fp32 average of the BatchNorm statistics);
the last column compares the communication part alone, measured as step minus compute. On one
host the node axis is NVLink, so 2x2 meshes use the intra-node link for both levels.

{
            table(
                [
                    "#",
                    "file",
                    "row",
                    "measured ms",
                    "predicted ms",
                    "error",
                    "comm measured / predicted ms",
                ],
                body,
                right=(0, 3, 4, 5),
            )
        }

**Median absolute error: {stats["median"] * 100:.1f}%** over {stats["count"]} rows
({stats["within10"]} within 10%); all-reduce rows {stats["allreduce"] * 100:.1f}%, step rows
{stats["step"] * 100:.1f}%, the communication part of the step rows alone
{stats["step_comm"] * 100:.0f}%.

{validation_notes(entries, rows, any(r["host_timed"] for r in cal["intra"]["rows"]))}{skipped_text}
""",
        stats,
    )


def validation_notes(entries: list[dict], rows: Sequence[cc.Row], host_timed_fit: bool) -> str:
    """Where the errors come from, with the numbers read off the rows."""
    worst = sorted(entries, key=lambda e: -abs(e["error"]))[:3]
    worst_text = "; ".join(f"{e['row'].summary()} ({pct(e['error'])})" for e in worst)
    spread = same_collective_spread(rows)
    spread_text = f"{min(spread) * 100:.0f}–{max(spread) * 100:.0f}%" if spread else "(no pair)"
    base_text = repeat_spread(rows)
    slow_xla = []
    plain = {
        (r.file, r.data["payload"], r.data["dtype"], r.data["mesh"]): r.data["time_s"]
        for r in rows
        if r.kind == "allreduce" and r.data["strategy"] == "plain" and "time_s" in r.data
    }
    for e in entries:
        d = e["row"].data
        key = (e["row"].file, d.get("payload"), d.get("dtype"), d.get("mesh"))
        if d.get("strategy") == "xla" and key in plain and d["time_s"] > 1.5 * plain[key]:
            slow_xla.append(f"{e['row'].summary()} ({d['time_s'] / plain[key]:.1f}x)")
    bucket_text = bucket_latency_note(entries, host_timed_fit) + residual_note(entries)
    return (
        "Where the errors come from. The step rows are close because compute dominates them; "
        f"their communication part alone is the difference of two noisy medians ({base_text}). "
        "The all-reduce rows "
        "scatter about as much as the measurements themselves: on one host the 1 x n and 2 x n/2 "
        "`plain` rows are the same all-reduce over the same GPUs, and they differ by "
        f"{spread_text}."
        f" Largest errors: {worst_text}."
        + (
            " Some `xla` rows take well over one all-reduce of their bytes against `plain` in the "
            f"same run: {'; '.join(slow_xla)}; that is XLA's own lowering of the mean over the "
            "stacked device axis, which the model (counting wire bytes) does not have."
            if slow_xla
            else ""
        )
        + bucket_text
    )


def bucket_latency_note(entries: list[dict], host_timed_fit: bool) -> str:
    """Measured vs predicted step difference between the smallest and largest bucket size of the
    same strategy, model and mesh in one run: what each extra collective really costs."""
    groups: dict[tuple, list[dict]] = {}
    for e in entries:
        d = e["row"].data
        if e["row"].kind == "step" and d.get("bucket_mib") is not None and not d.get("xla_flags"):
            key = (e["row"].file, d["model"], d["mesh_shape"], d["strategy"])
            groups.setdefault(key, []).append(e)
    notes = []
    for (file, model, mesh, strategy), group in sorted(groups.items()):
        if len(group) < 2:
            continue
        small, large = sorted(group, key=lambda e: e["row"].data["bucket_mib"])[:: len(group) - 1]
        notes.append(
            f"{model} {mesh} {strategy} in `{os.path.basename(file)}`, "
            f"{small['row'].data['bucket_mib']:g} MiB minus "
            f"{large['row'].data['bucket_mib']:g} MiB buckets: "
            f"{ms(small['measured_s'] - large['measured_s'])} ms measured, "
            f"{ms(small['predicted_s'] - large['predicted_s'])} ms predicted"
        )
    if not notes:
        return ""
    cause = (
        " The fixed cost per collective was fitted on host-timed rows, which carry part of the "
        "host's dispatch: an upper bound for a collective inside one compiled step."
        if host_timed_fit
        else ""
    )
    return f" Bucket size within one run: {'; '.join(notes)}.{cause}"


def residual_note(entries: list[dict]) -> str:
    """Measured minus predicted communication of the step rows, per model and per gradient leaf:
    a cost that does not depend on the plan points at per-leaf work outside the collectives."""
    by_model: dict[str, list[float]] = {}
    for e in entries:
        if "predicted_comm_s" in e and not e["row"].data.get("xla_flags"):
            extra = e["measured_s"] - e["compute_s"] - e["predicted_comm_s"]
            by_model.setdefault(e["row"].data["model"], []).append(extra)
    if not by_model:
        return ""
    parts, points = [], []
    for model, extra in sorted(by_model.items()):
        leaves = len(model_shapes(model).backward)
        med = statistics.median(extra)
        points.append((leaves, med))
        parts.append(
            f"{model} {ms(med)} ms ({len(extra)} rows, {ms(min(extra))} to {ms(max(extra))}; "
            f"{leaves} gradient leaves)"
        )
    points.sort()
    follows = len(points) > 1 and all(a[1] < b[1] for a, b in itertools.pairwise(points))
    verdict = (
        "The remainder is larger for the model with more leaves, as per-leaf kernels outside the "
        "collectives (the casts and slices of packing and unpacking) would make it"
        if follows
        else "The remainder does not follow the number of leaves"
    )
    return (
        " Measured minus predicted communication of the step rows, median per model: "
        + "; ".join(parts)
        + f". {verdict}; it is not in the model (`step_overhead_s` is 0) until a profile "
        "measures it."
    )


def repeat_spread(rows: Sequence[cc.Row]) -> str:
    """The same one-device step measured in different runs on the same device kind."""
    runs: dict[tuple, list[float]] = {}
    for r in rows:
        if r.kind == "step" and r.data.get("devices") == 1 and "step_time_s" in r.data:
            key = (r.environment.get("device_kind"), r.data["model"], r.data["per_device_batch"])
            runs.setdefault(key, []).append(r.data["step_time_s"])
    repeated = [(k, v) for k, v in runs.items() if len(v) > 1]
    if not repeated:
        return "no step was measured twice"
    return "; ".join(
        f"the one-device {model} step on {kind}: {', '.join(ms(t) for t in times)} ms in "
        f"{len(times)} runs"
        for (kind, model, _), times in repeated
    )


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


def render_excluded(cal: dict[str, Any]) -> str:
    by_reason: dict[str, list[str]] = {}
    for e in cal["excluded"]:
        by_reason.setdefault(e["reason"], []).append(e["row"])
    body = [(reason, len(ids), compact_ids(ids)) for reason, ids in by_reason.items()]
    inputs = [r["row"] for r in cal["intra"]["rows"]] + [c["row"] for c in cal["compute"]]
    return f"""### Rows not validated

Excluded from both fit and validation, {len(cal["excluded"])} rows (rules in
`scripts/calibrate_comm.py:exclusion_reason`; row lists are indices into each file's list):

{table(["reason", "rows", "which"], body, right=(1,))}

Inputs, not predictions: the fit rows above and the one-device (1x1) step rows, which are the
compute term: {compact_ids(inputs)}.
"""


def render_auto(cal: dict[str, Any]) -> str:
    """What `resolve` picks for both models on one host and across nodes."""
    cases = [
        ("one host", 1, 2, None),
        ("one host", 1, 4, None),
        ("one host", 2, 2, None),
        ("one host", 1, 8, None),
        (cal["default_fabric"], 2, 8, cal["default_fabric"]),
        (cal["default_fabric"], 256, 8, cal["default_fabric"]),
        ("ndr400_per_node", 2, 8, "ndr400_per_node"),
        ("ndr400_per_node", 256, 8, "ndr400_per_node"),
    ]
    body, picks = [], []
    for name, label in MODELS.items():
        shapes = model_shapes(name)
        for links, node, gpu, fabric in cases:
            model = cm.load_model(cal, fabric=fabric, single_host=fabric is None)
            comm = types.SimpleNamespace(
                strategy=cm.AUTO,
                bucket_bytes=cm.AUTO_BYTES,
                hybrid_crossover_bytes=cm.AUTO_BYTES,
                dtype=WIRE,
            )
            p = cm.resolve(comm, node=node, gpu=gpu, leaf_sizes=shapes.backward, model=model)
            body.append(
                (
                    label,
                    f"{node}x{gpu}",
                    f"`{links}`",
                    p.strategy,
                    f"{p.bucket_bytes / cc.MIB:g}",
                    f"{p.hybrid_crossover_bytes / cc.MIB:g}",
                    p.buckets,
                    ms(p.comm_s),
                )
            )
            picks.append((label, f"{node}x{gpu}", links, p))
    return f"""## What `auto` picks

`comm.strategy='auto'`, `comm.bucket_bytes=-1`, `comm.hybrid_crossover_bytes=-1` (ml_collections
fields are typed by their default, so a byte count cannot take the string "auto"; -1 is
`comm_model.AUTO_BYTES`). The trainer calls `comm_model.resolve` at start-up; explicit values win.
Wire dtype {WIRE}:

{
        table(
            [
                "model",
                "mesh",
                "links",
                "strategy",
                "bucket MiB",
                "crossover MiB",
                "buckets",
                "predicted comm ms/step",
            ],
            body,
            right=(4, 5, 6, 7),
        )
    }

{auto_notes(picks)}
"""


def auto_notes(picks: list[tuple[str, str, str, cm.Plan]]) -> str:
    """What the picks have in common, read off them."""
    one_bucket = all(p.buckets == 1 for *_, p in picks)
    by_strategy: dict[str, list[str]] = {}
    for label, mesh, links, p in picks:
        by_strategy.setdefault(p.strategy, []).append(f"{label} {mesh} `{links}`")
    chosen = "; ".join(f"**{s}** for {', '.join(c)}" for s, c in by_strategy.items())
    bucket = (
        "Every pick is one bucket holding all gradients: with no overlap measured the model "
        "charges each collective its latency and nothing for size, so fewer, larger buckets "
        "always cost less; bucket size trades off only once a measured overlap says which buckets "
        "hide behind backward."
        if one_bucket
        else "Where several buckets win, the latency saved by fusing is outweighed by the hybrid "
        "split of small and large buckets."
    )
    return (
        f"Picks: {chosen}. {bucket} With NCCL's tree algorithm a flat all-reduce already crosses "
        "the network in about log2(nodes) steps, so the explicit hierarchical scheme saves latency "
        "only against a ring; its extra intra-node stages pay off where a node's share of the "
        "network is small next to NVLink."
    )


def render_scaling_table(label: str, rows: list[dict]) -> str:
    head = ["GPUs", "nodes", "img/GPU", "compute ms"]
    for s in cm.STRATEGIES:
        head += [f"{s} comm ms", f"{s} eff.", f"{s} s/epoch"]
    head.append("auto")
    body = []
    for r in rows:
        line = [r["gpus"], r["nodes"], r["per_gpu"], ms(r["compute_s"])]
        for s in cm.STRATEGIES:
            line += [ms(r[s]["plan"].comm_s), f"{r[s]['efficiency']:.3f}", f"{r[s]['epoch_s']:.3g}"]
        line.append(r["auto"])
        body.append(line)
    return f"**{label}**\n\n" + table(head, body, right=tuple(range(len(head) - 1)))


def sensitivity(cal: dict[str, Any], per_image: dict[str, float]) -> str:
    """Efficiency at the largest GPU count for every fabric, wire dtype and strategy."""
    gpus = GPU_COUNTS[-1]
    body = []
    for fabric in cal["fabrics"]:
        model = cm.load_model(cal, fabric=fabric)
        for name, label in MODELS.items():
            for wire in ("float32", "bfloat16"):
                r = scaling_rows(name, model, per_image[name], wire, counts=(gpus,))[0]
                body.append(
                    [f"`{fabric}`", label, wire]
                    + [f"{r[s]['efficiency']:.3f}" for s in cm.STRATEGIES]
                )
    return f"Efficiency at {gpus} GPUs by fabric and wire dtype (same compute):\n\n" + table(
        ["fabric", "model", "wire", *cm.STRATEGIES], body, right=(3, 4, 5)
    )


def paper_row(name: str, e: dict[str, Any]) -> tuple:
    """One row of the paper table: what the paper reports, what the model predicts."""
    best = e["best"]
    predicted = (
        f"{e['epoch_predicted_s']:.2f}"
        if "epoch_predicted_s" in e
        else f"≥ {e['comm_epoch_s']:.2f} (comm alone)"
    )
    return (
        MODELS[name],
        e["gpus"],
        PAPER[name]["minutes"],
        PAPER[name]["epochs"],
        f"{e['epoch_reported_s']:.2f}",
        f"{best.strategy}, {best.bucket_bytes / cc.MIB:g} MiB",
        ms(best.comm_s),
        ms(e["compute_s"]) if "compute_s" in e else "no figure",
        predicted,
        f"{e['efficiency_predicted']:.3f}" if "efficiency_predicted" in e else "",
        f"{e['efficiency_reported']:.3f}" if "efficiency_reported" in e else "",
    )


def render_paper(paper: dict[str, Any], cal: dict[str, Any], per_image: dict[str, float]) -> str:
    rows = [paper_row(name, e) for name, e in paper.items()]
    speed = [
        (
            MODELS[n],
            PAPER["speedup_gpus"],
            f"{PAPER[n]['speedup_vs_nccl']}x",
            f"{e['speedup_per_leaf']:.1f}x",
            f"{e['speedup_fused']:.2f}x",
        )
        for n, e in paper.items()
    ]
    fabric = cal["fabrics"]["paper_100g_per_node"]
    pcie = cal["reference_intra"]["pcie3_x16"]
    return f"""## Against the paper (its own hardware, re-predicted)

Jia et al. report ({PAPER["source"]}). The model re-predicts their runs with their hardware's
figures: {pcie["description"]} inside a node, {fabric["description"]} across nodes, wire dtype
{PAPER_WIRE} (assumed), and compute from the one-P40 rate the paper reports for ResNet-50
({PAPER["p40_resnet50_images_per_s"]} images/s, taken as linear in the per-GPU batch). The paper
gives no one-GPU AlexNet rate, so for AlexNet-BN only the communication is predicted.

{
        table(
            [
                "model",
                "GPUs",
                "paper min",
                "epochs",
                "paper s/epoch",
                "best plan (model)",
                "comm ms/step",
                "compute ms/step",
                "predicted s/epoch",
                "predicted eff.",
                "paper's implied eff.",
            ],
            rows,
            right=(1, 2, 3, 4, 6, 7, 8, 9, 10),
        )
    }

"Paper's implied eff." is the reported images/s per GPU over the one-GPU rate. All-reduce speed-up
of the paper's scheme (hybrid, fused) over NCCL-based training, as the model sees it on the same
hardware:

{
        table(
            [
                "model",
                "GPUs",
                "paper",
                "model: vs a flat ring per tensor",
                "model: vs a flat ring of the same buckets",
            ],
            speed,
            right=(1, 2, 3, 4),
        )
    }

{paper_notes(paper, per_image)}
"""


def paper_notes(paper: dict[str, Any], per_image: dict[str, float]) -> str:
    """Agreement and disagreement with the paper, each claim checked against the numbers."""
    r, a = paper["resnet50"], paper["alexnet_bn"]
    between = all(
        e["speedup_fused"] <= PAPER[n]["speedup_vs_nccl"] <= e["speedup_per_leaf"]
        for n, e in paper.items()
    )
    order = (r["speedup_per_leaf"] > a["speedup_per_leaf"]) == (
        PAPER["resnet50"]["speedup_vs_nccl"] > PAPER["alexnet_bn"]["speedup_vs_nccl"]
    )
    nbytes = {n: sum(model_shapes(n).backward) for n in MODELS}
    speed = (
        f"The paper's speed-ups ({PAPER['resnet50']['speedup_vs_nccl']}x ResNet-50, "
        f"{PAPER['alexnet_bn']['speedup_vs_nccl']}x AlexNet-BN) "
        + (
            "lie between the model's two baselines (a ring per tensor, a ring of the same fused "
            "buckets): consistent with an NCCL-based baseline that fused some of its tensors. "
            if between
            else "do not lie between the model's two baselines. "
        )
        + (
            "The ordering agrees: ResNet-50's many small tensors gain more than AlexNet-BN's few "
            f"large ones ({len(model_shapes('resnet50').backward)} against "
            f"{len(model_shapes('alexnet_bn').backward)} tensors)."
            if order
            else "The ordering of the two models differs from the paper's."
        )
    )
    bound = (
        f"On the measured H200 steps AlexNet-BN computes an image "
        f"{per_image['resnet50'] / per_image['alexnet_bn']:.1f}x faster than ResNet-50 while its "
        f"gradients are {nbytes['alexnet_bn'] / nbytes['resnet50']:.1f}x larger, and on the "
        f"paper's hardware its communication alone is {a['comm_epoch_s']:.2f} s per epoch, "
        f"{a['comm_epoch_s'] / a['epoch_reported_s'] * 100:.0f}% of the paper's whole epoch; "
        f"ResNet-50's is {ms(r['best'].comm_s)} ms per step against {ms(r['compute_s'])} ms of "
        "compute. That is the paper's split: ResNet-50 compute-bound, AlexNet communication-bound."
    )
    ratio = r["epoch_predicted_s"] / r["epoch_reported_s"]
    choice = (
        "On the paper's hardware the model picks hierarchical for ResNet-50's gradients and the "
        "flat ring for AlexNet-BN's large buckets: the paper's hybrid rule (hierarchical for "
        "small messages, the ring for large ones). "
        if r["best"].strategy == "hierarchical" and a["best"].strategy == "flat"
        else f"On the paper's hardware the model picks {r['best'].strategy} for ResNet-50 and "
        f"{a['best'].strategy} for AlexNet-BN. "
    )
    return f"""**Where they agree.** On a ring-only library, fusing the gradients and reducing them
hierarchically is what makes {PAPER["speedup_gpus"]:,} P40s usable: the model puts a flat ring
per tensor
{r["speedup_per_leaf"]:.0f}x (ResNet-50) and {a["speedup_per_leaf"]:.0f}x (AlexNet-BN) behind the
paper's scheme. {choice}{speed} {bound}

**Where they disagree.** For ResNet-50 at {r["gpus"]} GPUs the model predicts
{r["epoch_predicted_s"]:.2f} s per epoch against the paper's {r["epoch_reported_s"]:.2f} s
({ratio:.2f}x), efficiency {r["efficiency_predicted"]:.2f} against the implied
{r["efficiency_reported"]:.2f}. What the model leaves out: the paper's time counts evaluation,
input and start-up besides the steps; the one-GPU rate is taken as linear in the batch, while at
{GLOBAL_BATCH // r["gpus"]} images per GPU a GPU runs below its large-batch rate; and the network
figures are nominal line rates of an assumed fabric, not the paper's measured links. All three
make the model's time shorter than the paper's."""


def plot(
    path: str,
    scaling: dict[str, dict[str, list[dict]]],
    paper_curve: list[dict],
    paper: dict[str, Any],
) -> None:
    """Efficiency against GPU count: one panel per model, a line per strategy and fabric."""
    import matplotlib  # pylint: disable=import-outside-toplevel

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

    fig, axes = plt.subplots(1, len(MODELS), figsize=(11, 4.2), sharey=True)
    # Hybrid is often identical to flat: drawn first and wide, so flat stays visible on top.
    styles = {
        "hybrid": ("tab:green", 4.0),
        "hierarchical": ("tab:orange", 1.5),
        "flat": ("tab:blue", 1.5),
    }
    for ax, (name, label) in zip(axes, MODELS.items()):
        for fabric, dash in zip(scaling, ("-", "--")):
            for s, (color, width) in styles.items():
                rows = scaling[fabric][name]
                ax.plot(
                    [r["gpus"] for r in rows],
                    [r[s]["efficiency"] for r in rows],
                    dash,
                    color=color,
                    linewidth=width,
                    alpha=0.5 if s == "hybrid" else 1.0,
                    marker="o",
                    markersize=3,
                    label=f"{s}, {fabric}",
                )
        if name == "resnet50":
            ax.plot(
                [r["gpus"] for r in paper_curve],
                [r["hierarchical"]["efficiency"] for r in paper_curve],
                ":",
                color="black",
                label="hierarchical on the paper's hardware (model)",
            )
            ax.plot(
                [paper[name]["gpus"]],
                [paper[name]["efficiency_reported"]],
                "k*",
                markersize=11,
                label="paper, implied from its reported time",
            )
        ax.set_xscale("log", base=2)
        ax.set_xticks(GPU_COUNTS, [str(g) for g in GPU_COUNTS])
        ax.set_xlabel("GPUs (8 per node), global batch 65,536")
        ax.set_title(f"{label}: predicted weak-scaling efficiency")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("compute / predicted step")
    axes[0].set_ylim(0, 1.02)
    axes[0].legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def render_doc(cal: dict[str, Any], rows: Sequence[cc.Row], png: str | None) -> str:
    """The whole of docs/scaling.md; also writes the plot to `png` unless it is None."""
    kind = cal["intra"]["device_kinds"][0]
    per_image, compute_src = {}, []
    for name in MODELS:
        per_image[name], src = compute_per_image(cal, name, kind)
        compute_src += src
    fabrics = [cal["default_fabric"], "ndr400_per_node"]
    scaling = {
        f: {n: scaling_rows(n, cm.load_model(cal, fabric=f), per_image[n], WIRE) for n in MODELS}
        for f in fabrics
    }
    paper = paper_comparison(cal)
    paper_curve = scaling_rows(
        "resnet50", paper_model(cal), 1 / PAPER["p40_resnet50_images_per_s"], PAPER_WIRE
    )
    if png:
        plot(png, scaling, paper_curve, paper)
    entries, skipped = validation(rows, cal)
    valid_text, stats = render_validation(entries, skipped, rows, cal)
    tables = "\n\n".join(
        render_scaling_table(
            f"{label}, fabric `{cal['default_fabric']}`", scaling[cal["default_fabric"]][name]
        )
        for name, label in MODELS.items()
    )
    return f"""# Scaling past one host: a calibrated communication model

Generated by `python -m scripts.predict_scaling` from `jia_jax/comm_calibration.json` (itself
from `python -m scripts.calibrate_comm docs/benchmarks/*.json`) and the raw benchmark JSONs; every
number below is computed by those scripts. Held-out median error: **{stats["median"] * 100:.1f}%**
over {stats["count"]} measured rows.

{MODEL_TEXT}
{render_calibration(cal)}
{valid_text}
{render_excluded(cal)}
{render_auto(cal)}
## Weak scaling at 64K to {GPU_COUNTS[-1]:,} GPUs

Global batch {GLOBAL_BATCH:,}, {GPUS_PER_NODE} GPUs per node, ImageNet's
{IMAGENET_TRAIN_IMAGES:,} training images per epoch, wire dtype {WIRE} (the 64K configs'
`comm.dtype`). Compute per step: the measured one-device {kind} step (rows
{compact_ids(compute_src)}; median seconds per image) times the images per GPU, i.e. linear in the
per-GPU batch. At the largest counts ({GLOBAL_BATCH // GPU_COUNTS[-2]} and
{GLOBAL_BATCH // GPU_COUNTS[-1]} images per GPU) a GPU runs below its large-batch rate, so there
the predicted epoch times are optimistic and the efficiencies pessimistic. Each strategy with its
best bucket (and crossover) from `resolve`'s grid; efficiency = compute / predicted step;
s/epoch = steps per epoch x predicted step; auto = the strategy `resolve` picks.

{tables}

![predicted weak-scaling efficiency](scaling.png)

Solid: `{fabrics[0]}`; dashed: `{fabrics[1]}`.

{sensitivity(cal, per_image)}

{render_paper(paper, cal, per_image)}

## Limits, and how to refit

- Inside a node the calibration is one host's NVLink ({kind}); every multi-node number rests on
  published link figures and the alpha-beta form, not on a measurement across hosts.
- `overlap` is {cal["overlap"]["value"]:g} until a profile measures it; with a constant fraction
  the plan choice does not depend on it.
- The `xla` strategy is approximated by as many equal all-reduces as the compiled step has.
- After new benchmarks (e.g. the device-timed 2-GPU runs): `python -m scripts.calibrate_comm
  docs/benchmarks/*.json && python -m scripts.predict_scaling`.
"""


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "jsons", nargs="*", help="benchmark JSONs (default: docs/benchmarks/*.json)"
    )
    parser.add_argument("--calibration", default=cc.DEFAULT_OUT)
    parser.add_argument("--out", default=os.path.join(cc.REPO, "docs", "scaling.md"))
    parser.add_argument("--png", default=os.path.join(cc.REPO, "docs", "scaling.png"))
    args = parser.parse_args(argv)
    paths = args.jsons or sorted(glob.glob(os.path.join(cc.REPO, "docs", "benchmarks", "*.json")))
    with open(args.calibration) as f:
        cal = json.load(f)
    doc = render_doc(cal, cc.load_rows(paths), args.png)
    with open(args.out, "w") as f:
        f.write(doc)
    print(f"wrote {cc.relpath(args.out)} and {cc.relpath(args.png)}")


if __name__ == "__main__":
    main()
