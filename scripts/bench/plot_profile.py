r"""Draws one step's window of a `scripts/bench/profile_step` trace: a lane per GPU stream, kernels
coloured by kind (convolutions/GEMMs, XLA fusions, concat/slice, copies, NCCL collectives).

  python -m scripts.bench.plot_profile docs/benchmarks/profile_2xH200.json.kernels.json.gz \
      resnet50:1x2:hierarchical:256 docs/profile_2xH200.png --title="..."

The window starts `--skip` step lengths after the first kernel and lasts one step length (the
traced span over the traced steps): queued steps run back to back, so it shows a step's worth of
work, not necessarily from its first kernel.
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections.abc import Sequence

COLOURS = {
    "conv/gemm": "#4c72b0",
    "fusion": "#8fbc8f",
    "concat/slice": "#dd8452",
    "copy": "#937860",
    "collective": "#c44e52",
}


def draw(kernels: dict[str, list], steps: int, skip: int, out: str, title: str) -> None:
    """Saves the picture of one step-length window of `kernels` (device -> kernel tuples)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    first = min(k[1] for ks in kernels.values() for k in ks)
    last = max(k[2] for ks in kernels.values() for k in ks)
    length = (last - first) / steps
    lo, hi = first + skip * length, first + (skip + 1) * length
    lanes = sorted({(dev, k[3]) for dev, ks in kernels.items() for k in ks})
    fig, ax = plt.subplots(figsize=(14, 0.6 * len(lanes) + 1.5))
    for y, (dev, stream) in enumerate(lanes):
        for name, start, end, s, kind in kernels[dev]:
            if s == stream and end > lo and start < hi:
                a, b = max(start, lo), min(end, hi)
                ax.broken_barh(
                    [((a - lo) / 1e3, (b - a) / 1e3)], (y - 0.4, 0.8), color=COLOURS[kind]
                )
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels(
        [
            f"{dev.split(':')[-1] and 'GPU ' + dev.split(':')[-1]} {s.split('(')[0]}"
            for dev, s in lanes
        ]
    )
    ax.set_xlabel("ms")
    ax.set_xlim(0, (hi - lo) / 1e3)
    ax.legend(
        handles=[plt.Rectangle((0, 0), 1, 1, color=c) for c in COLOURS.values()],
        labels=list(COLOURS),
        loc="upper right",
        ncol=len(COLOURS),
        fontsize=8,
    )
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kernels", help="<profile_step --out>.kernels.json.gz")
    parser.add_argument("case", help="the case as given to profile_step --cases")
    parser.add_argument("out", help="PNG to write")
    parser.add_argument("--steps", type=int, default=5, help="steps traced (--trace_steps)")
    parser.add_argument("--skip", type=int, default=2, help="step lengths to skip")
    parser.add_argument("--title", default="")
    args = parser.parse_args(argv)
    with gzip.open(args.kernels, "rt") as f:
        kernels = json.load(f)[args.case]
    draw(kernels, args.steps, args.skip, args.out, args.title or args.case)


if __name__ == "__main__":
    main()
