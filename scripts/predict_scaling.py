r"""Weak-scaling predictions of the communication model to 2,048 GPUs, next to Jia et al.'s
reported results, and `docs/scaling.png`.

From the calibration (`jia_jax/comm_calibration.json`, written by `scripts/calibrate_comm.py`,
validated by `scripts/validate_comm.py`), the published link figures it records with their sources,
and the paper's results (`PAPER`). `python -m scripts.render scaling:<table>` prints the tables of
docs/scaling.md; this draws its picture:

  python -m scripts.calibrate_comm docs/benchmarks/*.json \
      --overlap_row='docs/benchmarks/bench_plans_2x2_256_4xH200.json#results[1]'
  python -m scripts.predict_scaling

Needs JAX (CPU is enough) for the models' parameter shapes, and matplotlib for the plot.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import types
from collections.abc import Sequence
from typing import Any

from jia_jax import comm_model as cm
from scripts import calibrate_comm as cc
from scripts.validate_comm import Shapes, model_shapes

IMAGENET_TRAIN_IMAGES = 1_281_167
GLOBAL_BATCH = 65536
GPUS_PER_NODE = 8
GPU_COUNTS = tuple(8 << k for k in range(9))  # 8 ... 2048
MODELS = {"resnet50": "ResNet-50", "alexnet_bn": "AlexNet-BN"}
WIRE = "float32"  # comm.dtype of the 64K configs
# Jia et al. 2018, "Highly Scalable Deep Learning Training System with Mixed-Precision: Training
# ImageNet in Four Minutes", arXiv:1807.11205.
PAPER = {
    "resnet50": {"gpus": 2048, "epochs": 90, "minutes": 6.6, "speedup_vs_nccl": 11},
    "alexnet_bn": {"gpus": 1024, "epochs": 95, "minutes": 4.0, "speedup_vs_nccl": 3},
    "speedup_gpus": 1024,
    "p40_resnet50_images_per_s": 218,  # one P40, mixed precision
    "source": (
        "arXiv:1807.11205, abstract and mixed-precision section; the AlexNet GPU count from the "
        "authors' GTC talk S9146 (developer.nvidia.com/gtc/2019/video/S9146)"
    ),
}
PAPER_WIRE = "float16"  # assumed: the paper trains in FP16 and fuses FP16 gradients


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


AUTO_CASES = (  # (links, node, gpu, fabric): what `auto` picks is shown for each
    ("one host", 1, 2, None),
    ("one host", 1, 4, None),
    ("one host", 2, 2, None),
    ("one host", 1, 8, None),
    ("default", 2, 8, "default"),
    ("default", 256, 8, "default"),
    ("ndr400_per_node", 2, 8, "ndr400_per_node"),
    ("ndr400_per_node", 256, 8, "ndr400_per_node"),
)


def auto_picks(cal: dict[str, Any]) -> list[tuple[str, str, str, cm.Plan]]:
    """(model, mesh, links, plan) that `resolve` picks for both models on one host and across
    nodes, wire dtype `WIRE`."""
    out = []
    for name, label in MODELS.items():
        shapes = model_shapes(name)
        for links, node, gpu, fabric in AUTO_CASES:
            if fabric == "default":
                links = fabric = cal["default_fabric"]
            model = cm.load_model(cal, fabric=fabric, single_host=fabric is None)
            comm = types.SimpleNamespace(
                strategy=cm.AUTO,
                bucket_bytes=cm.AUTO_BYTES,
                hybrid_crossover_bytes=cm.AUTO_BYTES,
                dtype=WIRE,
            )
            p = cm.resolve(comm, node=node, gpu=gpu, leaf_sizes=shapes.backward, model=model)
            out.append((label, f"{node}x{gpu}", links, p))
    return out


def predictions(cal: dict[str, Any]) -> dict[str, Any]:
    """Everything docs/scaling.md shows beyond the validation: per-image compute, the scaling
    rows per fabric and model, and the paper's runs re-predicted."""
    kind = cal["intra"]["device_kinds"][0]
    per_image, compute_rows = {}, []
    for name in MODELS:
        per_image[name], rows = compute_per_image(cal, name, kind)
        compute_rows += rows
    fabrics = [cal["default_fabric"], "ndr400_per_node"]
    return {
        "device_kind": kind,
        "per_image": per_image,
        "compute_rows": compute_rows,
        "scaling": {
            f: {
                n: scaling_rows(n, cm.load_model(cal, fabric=f), per_image[n], WIRE) for n in MODELS
            }
            for f in fabrics
        },
        "paper": paper_comparison(cal),
        "paper_curve": scaling_rows(
            "resnet50", paper_model(cal), 1 / PAPER["p40_resnet50_images_per_s"], PAPER_WIRE
        ),
    }


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


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calibration", default=cc.DEFAULT_OUT)
    parser.add_argument("--png", default=os.path.join(cc.REPO, "docs", "scaling.png"))
    args = parser.parse_args(argv)
    with open(args.calibration) as f:
        cal = json.load(f)
    p = predictions(cal)
    plot(args.png, p["scaling"], p["paper_curve"], p["paper"])
    print(f"wrote {cc.relpath(args.png)}")


if __name__ == "__main__":
    main()
