"""The tables of docs/scaling.md, from the calibration and the raw benchmark JSONs.

Each table has a name (`python -m scripts.render scaling:<name>`); the prose around them is
written by hand and its figures are checked by tests/test_docs.py.
"""

from __future__ import annotations

import functools
import glob
import json
import os
from collections.abc import Callable, Sequence
from typing import Any

from jia_jax import comm_model as cm
from scripts import calibrate_comm as cc
from scripts import predict_scaling as ps
from scripts import validate_comm as vc


@functools.cache
def inputs() -> tuple[dict[str, Any], list[cc.Row]]:
    """The committed calibration and every row of docs/benchmarks/*.json."""
    with open(cc.DEFAULT_OUT) as f:
        cal = json.load(f)
    paths = sorted(glob.glob(os.path.join(cc.REPO, "docs", "benchmarks", "*.json")))
    return cal, cc.load_rows(paths)


@functools.cache
def validation() -> tuple[list[dict], list[dict]]:
    cal, rows = inputs()
    return vc.validation(rows, cal)


@functools.cache
def predictions() -> dict[str, Any]:
    return ps.predictions(inputs()[0])


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


def fit() -> str:
    """The `plain` rows the link inside a node is fitted on, measured against fitted."""
    rows = [
        (
            f"`{r['row']}`",
            r["summary"],
            ms(r["measured_s"]),
            ms(r["fitted_s"]),
            pct(r["fitted_s"] / r["measured_s"] - 1),
        )
        for r in inputs()[0]["intra"]["rows"]
    ]
    return table(["row", "what", "measured ms", "fitted ms", "error"], rows, right=(2, 3, 4))


def links() -> str:
    """The network fabrics and the reference intra-node link, from published figures."""
    cal = inputs()[0]

    def row(name: str, f: dict[str, Any], algorithms: str) -> tuple:
        alpha, beta = f"{f['alpha_s'] * 1e6:.1f}", f"{f['beta_bytes_per_s'] / 1e9:.3g}"
        return (name, f["description"], alpha, beta, algorithms, f["source"])

    rows = [row(f"`{k}`", f, ", ".join(f["algorithms"])) for k, f in cal["fabrics"].items()]
    rows += [row(f"`{k}` (inside a node)", f, "ring") for k, f in cal["reference_intra"].items()]
    header = ["name", "what", "alpha us", "beta GB/s per GPU", "algorithms", "source"]
    return table(header, rows, right=(2, 3))


def held_out() -> str:
    """Every validated row: measured, predicted, error, and the communication part of steps."""
    body = []
    for i, e in enumerate(validation()[0], 1):
        r = e["row"]
        comm = ""
        if "predicted_comm_s" in e:
            comm = f"{ms(e['measured_s'] - e['compute_s'])} / {ms(e['predicted_comm_s'])}"
        where = f"`{os.path.basename(r.file)}` {r.section}[{r.index}]"
        body.append(
            (
                i,
                where,
                r.summary(),
                ms(e["measured_s"]),
                ms(e["predicted_s"]),
                pct(e["error"]),
                comm,
            )
        )
    header = ["#", "file", "row", "measured ms", "predicted ms", "error"]
    header.append("comm measured / predicted ms")
    return table(header, body, right=(0, 3, 4, 5))


def not_validated() -> str:
    """Rows excluded from fit and validation, and rows that could not be predicted, by reason."""
    by_reason: dict[str, list[str]] = {}
    for e in inputs()[0]["excluded"]:
        by_reason.setdefault(e["reason"], []).append(e["row"])
    for s in validation()[1]:
        by_reason.setdefault(s["reason"], []).append(s["row"].row_id)
    body = [(reason, len(ids), vc.compact_ids(ids)) for reason, ids in by_reason.items()]
    return table(["reason", "rows", "which"], body, right=(1,))


def emulated_links() -> str:
    """The links of hosts emulated on one machine (the launcher's NCCL setting), fitted on the
    link benchmark's sizes: each level's alpha and beta and each size's fit error."""
    cal = inputs()[0]
    fit = cal["emulated_hosts"][cal["default_emulated"]]
    body = []
    for level, what in (
        ("intra", "`gpu` axis: NVLink inside a process"),
        ("inter", "`node` axis: the GPU pairs across hosts at once (hierarchical)"),
        ("flat_inter", "both axes: one ring over every GPU (flat)"),
    ):
        link = fit[level]
        errors = ", ".join(
            f"{r['payload_bytes'] / cc.MIB:g} MiB {pct(r['fitted_s'] / r['measured_s'] - 1)}"
            for r in link["rows"]
        )
        beta = f"{link['beta_bytes_per_s'] / 1e9:.3g}"
        body.append((level, what, f"{link['alpha_s'] * 1e6:.1f}", beta, errors))
    header = ["level", "what", "alpha us", "beta GB/s per GPU", "fitted vs measured"]
    return table(header, body, right=(2, 3))


def emulated_plans() -> str:
    """The trainer's step across emulated hosts, every plan measured against the model's
    prediction (compute: the one-GPU step of the same call)."""
    body = []
    for e in inputs()[0]["plans"]:
        file, index = e["row"].split("#")
        body.append((
            f"`{os.path.basename(file)}` {index}",
            e["variant"],
            e["per_device_batch"],
            e["strategy"],
            f"{e['bucket_bytes'] / cc.MIB:g}",
            "yes" if e["overlap"] else "no",
            ms(e["measured_s"]),
            ms(e["predicted_s"]),
            "fitted" if e["fitted"] else pct(e["error"]),
        ))
    header = ["row", "variant", "per GPU", "strategy", "bucket MiB", "overlap", "measured ms"]
    header += ["predicted ms", "error"]
    return table(header, body, right=(2, 4, 6, 7, 8))


def auto() -> str:
    """What `comm_model.resolve` picks on one host and across nodes."""
    body = [
        (
            label,
            mesh,
            f"`{links_}`",
            p.strategy,
            f"{p.bucket_bytes / cc.MIB:g}",
            f"{p.hybrid_crossover_bytes / cc.MIB:g}",
            p.buckets,
            ms(p.comm_s),
        )
        for label, mesh, links_, p in ps.auto_picks(inputs()[0])
    ]
    header = ["model", "mesh", "links", "strategy", "bucket MiB", "crossover MiB", "buckets"]
    header.append("predicted comm ms/step")
    return table(header, body, right=(4, 5, 6, 7))


def weak_scaling(model: str) -> str:
    """Predicted step, efficiency and epoch time per GPU count and strategy, default fabric."""
    rows = predictions()["scaling"][inputs()[0]["default_fabric"]][model]
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
    return table(head, body, right=tuple(range(len(head) - 1)))


def sensitivity() -> str:
    """Efficiency at the largest GPU count for every fabric, wire dtype and strategy."""
    cal, per_image = inputs()[0], predictions()["per_image"]
    body = []
    for fabric in cal["fabrics"]:
        model = cm.load_model(cal, fabric=fabric)
        for name, label in ps.MODELS.items():
            for wire in ("float32", "bfloat16"):
                counts = (ps.GPU_COUNTS[-1],)
                r = ps.scaling_rows(name, model, per_image[name], wire, counts=counts)[0]
                body.append(
                    [f"`{fabric}`", label, wire]
                    + [f"{r[s]['efficiency']:.3f}" for s in cm.STRATEGIES]
                )
    return table(["fabric", "model", "wire", *cm.STRATEGIES], body, right=(3, 4, 5))


def paper() -> str:
    """The paper's runs: what it reports, what the model predicts on its hardware."""
    rows = []
    for name, e in predictions()["paper"].items():
        best, reported = e["best"], ps.PAPER[name]
        predicted = (
            f"{e['epoch_predicted_s']:.2f}"
            if "epoch_predicted_s" in e
            else f"≥ {e['comm_epoch_s']:.2f} (comm alone)"
        )
        rows.append(
            (
                ps.MODELS[name],
                e["gpus"],
                reported["minutes"],
                reported["epochs"],
                f"{e['epoch_reported_s']:.2f}",
                f"{best.strategy}, {best.bucket_bytes / cc.MIB:g} MiB",
                ms(best.comm_s),
                ms(e["compute_s"]) if "compute_s" in e else "no figure",
                predicted,
                f"{e['efficiency_predicted']:.3f}" if "efficiency_predicted" in e else "",
                f"{e['efficiency_reported']:.3f}" if "efficiency_reported" in e else "",
            )
        )
    header = ["model", "GPUs", "paper min", "epochs", "paper s/epoch", "best plan (model)"]
    header += ["comm ms/step", "compute ms/step", "predicted s/epoch", "predicted eff."]
    header.append("paper's implied eff.")
    return table(header, rows, right=(1, 2, 3, 4, 6, 7, 8, 9, 10))


def paper_speedup() -> str:
    """The paper's all-reduce speed-up over NCCL-based training, and the model's two readings."""
    rows = [
        (
            ps.MODELS[n],
            ps.PAPER["speedup_gpus"],
            f"{ps.PAPER[n]['speedup_vs_nccl']}x",
            f"{e['speedup_per_leaf']:.1f}x",
            f"{e['speedup_fused']:.2f}x",
        )
        for n, e in predictions()["paper"].items()
    ]
    header = ["model", "GPUs", "paper", "model: vs a flat ring per tensor"]
    header.append("model: vs a flat ring of the same buckets")
    return table(header, rows, right=(1, 2, 3, 4))


TABLES: dict[str, Callable[[], str]] = {
    "fit": fit,
    "links": links,
    "held_out": held_out,
    "not_validated": not_validated,
    "emulated_links": emulated_links,
    "emulated_plans": emulated_plans,
    "auto": auto,
    "weak_scaling_resnet50": functools.partial(weak_scaling, "resnet50"),
    "weak_scaling_alexnet_bn": functools.partial(weak_scaling, "alexnet_bn"),
    "sensitivity": sensitivity,
    "paper": paper,
    "paper_speedup": paper_speedup,
}
