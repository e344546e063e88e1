"""Draws where XLA put each gradient all-reduce of the 2-host step, before and after the overlap.

  python -m scripts.render.overlap_plot docs/benchmarks/bench_overlap_2xH100.json \
      docs/overlap_2xH100.png --device=H100
  python -m scripts.render.overlap_plot docs/benchmarks/bench_overlap_deferred_2xH200.json \
      docs/overlap_told_2xH200.png --variants=overlap_cap,peer
  python -m scripts.render.overlap_plot docs/benchmarks/bench_overlap_last_apart_2x1_2xH200.json \
      docs/overlap_last_2xH200.png --variants=overlap_cap,last2mib_uncombined

One row per (variant, per-GPU batch) of the raw file's 2 processes x 1 GPU rows of `--variants`
(by default no_overlap and overlap), told or not as the raw file ran them; the horizontal
axis is the step's convolutions in XLA's schedule order (forward, then backward's data and weight
gradients), the unit in which the raw file records each all-reduce's start and done. A bar runs
from an all-reduce's start to its done: the convolutions under it run while it is in flight; a
tick is an all-reduce XLA waits for where it starts.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

# ResNet-50's forward has 53 convolutions (stem, 16 blocks of 3, 4 projections); the 105 after
# them are backward's (no data gradient for the stem's input).
FORWARD_CONVOLUTIONS = 53


def bars(doc: dict[str, Any], variants: tuple[str, ...]) -> list[tuple[str, list[tuple[int, int]]]]:
    """(label, [(start, done) in convolutions]) of each 2x1 row of `variants`, gradient buckets
    only (bf16 all-reduces)."""
    out = []
    for r in doc["results"]:
        if r.get("layout") != "2x1" or r.get("variant") not in variants or "schedule" not in r:
            continue
        spans = [
            (c["convolutions_before_start"], c["convolutions_before_start"] + c["convolutions_between"])
            for c in r["schedule"]
            if c["op"] == "all-reduce" and "bf16" in c["shape"]
        ]
        out.append((f"{r['variant']}, {r['per_device_batch']}/GPU", spans))
    return out


def draw(source: str, target: str, variants: tuple[str, ...], device: str = "") -> None:
    """Saves the picture of `source`'s 2x1 rows of `variants` to `target`, titled with `device`
    (by default the GPU the raw file's environment names)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(source) as f:
        doc = json.load(f)
    rows = bars(doc, variants)
    if not rows:
        raise ValueError(f"{source} has no 2x1 row with a schedule of the variants {variants}")
    recorded = doc.get("environment", {}).get("device_kind", "GPU")
    device = device or recorded.removeprefix("NVIDIA ")
    total = max(c["convolutions"] for r in doc["results"] for c in r.get("schedule", [])[:1])
    fig, ax = plt.subplots(figsize=(9, 0.6 * len(rows) + 1.2))
    for y, (label, spans) in enumerate(rows):
        for start, done in spans:
            ax.barh(y, max(done - start, 0.6), left=start, height=0.5, color="tab:orange",
                    edgecolor="black")
    ax.axvspan(0, FORWARD_CONVOLUTIONS, color="0.9", zorder=0)
    ax.text(FORWARD_CONVOLUTIONS / 2, len(rows) - 0.4, "forward", ha="center")
    ax.text((FORWARD_CONVOLUTIONS + total) / 2, len(rows) - 0.4, "backward", ha="center")
    ax.set_yticks(range(len(rows)), [label for label, _ in rows])
    ax.set_xlim(0, total + 2)
    ax.set_ylim(-0.6, len(rows))
    ax.set_xlabel("convolutions of the step, in XLA's schedule order")
    ax.set_title(f"Gradient all-reduces of 2 hosts x 1 {device} (bar: start to done)")
    fig.tight_layout()
    fig.savefig(target, dpi=110)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", help="a scripts.bench.overlap raw file")
    parser.add_argument("target", help="the PNG to write")
    parser.add_argument("--variants", default="no_overlap,overlap", help="comma-separated")
    parser.add_argument("--device", default="", help="the GPU's name in the title, for raw files "
                        "that do not record it")
    args = parser.parse_args(argv)
    draw(args.source, args.target, tuple(args.variants.split(",")), args.device)


if __name__ == "__main__":
    main()
