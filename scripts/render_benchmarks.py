"""Markdown tables from the JSON that scripts/bench_step.py, bench_allreduce.py and bench_input.py
write.

docs/benchmarks.md pastes this script's output, so no number there is typed by hand:

  python -m scripts.render_benchmarks docs/benchmarks/bench_step_4xH200.json \
      docs/benchmarks/bench_allreduce_4xH200.json
"""

from __future__ import annotations

import json
import sys
from typing import Any


def _environment(doc: dict[str, Any]) -> str:
    env = doc["environment"]
    return (
        f"{env['device_count']} x {env['device_kind']}, jax {env['jax_version']}, "
        f"XLA_FLAGS='{env['xla_flags']}'"
    )


def _flags(flags: str | list[str]) -> str:
    return flags if isinstance(flags, str) else " ".join(flags)


def step_table(doc: dict[str, Any]) -> str:
    """One row per train-step case, plus the XLA-flag variants."""
    lines = [
        f"Train step ({_environment(doc)}; per-device batch as listed, bf16, synthetic data):",
        "",
        "| model | mesh | strategy | bucket MiB | per-device batch | step ms | images/s | "
        "images/s per GPU | efficiency vs 1x1 | compiled collectives |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    rows = [(r, "") for r in doc["results"]]
    rows += [
        (r, f" (`{_flags(r['xla_flags'])}`: {r['speedup_vs_default']:.3f}x)")
        for r in doc.get("variants", [])
        if "step_time_s" in r
    ]
    for r, note in rows:
        if "step_time_s" not in r:
            lines.append(
                f"| {r['model']} | {r.get('mesh_shape', r['mesh'])} | {r['strategy']} | "
                f"{r.get('bucket_mib') or ''} | | skipped: {r.get('skipped') or r.get('error')} "
                "| | | | |"
            )
            continue
        collectives = ", ".join(f"{k} x{v}" for k, v in sorted(r["collectives"].items()))
        lines.append(
            f"| {r['model']} | {r['mesh_shape']} | {r['strategy']}{note} | {r['bucket_mib'] or ''} | "
            f"{r['per_device_batch']} | {1e3 * r['step_time_s']:.1f} | {r['images_per_s']:.0f} | "
            f"{r['images_per_s_per_device']:.0f} | {r['efficiency']:.3f} | {collectives} |"
        )
    return "\n".join(lines)


def allreduce_table(doc: dict[str, Any]) -> str:
    """Bus bandwidth per case and its ratio to one plain psum of the same bytes, same run."""
    lines = [
        f"All-reduce ({_environment(doc)}): bus bandwidth 2(n-1)/n * bytes / time; ratio = ours / "
        "one plain `psum` of a flat buffer of the same bytes in the same run:",
        "",
        "| payload | wire dtype | mesh | strategy | bucket MiB | time ms | bus GB/s | ratio |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for r in doc["results"]:
        if "time_s" not in r:
            continue
        bucket = "" if r["bucket_bytes"] is None else f"{r['bucket_bytes'] / 2**20:g}"
        payload = (
            f"{r['payload']} ({r['payload_bytes'] / 2**20:.0f} MiB, {r['leaves']} leaves)"
            if r["leaves"] > 1
            else f"flat {r['payload_bytes'] / 2**20:g} MiB"
        )
        lines.append(
            f"| {payload} | {r['dtype']} | {r['mesh']} | {r['strategy']} | {bucket} | "
            f"{1e3 * r['time_s']:.3f} | {r['busbw_gbps']:.1f} | {r['ratio']:.2f} |"
        )
    return "\n".join(lines)


def input_table(doc: dict[str, Any]) -> str:
    """Train input images/s per loader and core count (scripts/bench_input.py)."""
    first = doc["results"][0]
    lines = [
        f"Train input ({doc['cpu_count']}-core host; {doc['dataset']['images']} JPEGs of "
        f"{doc['dataset']['mean_kb']:.0f} KB mean, batch {first['batch']}, "
        f"{first['image_size']} px {first['image_dtype']}):",
        "",
        "| loader | cores | threads | workers | images/s | images/s per core | "
        "images per CPU-second |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in doc["results"]:
        lines.append(
            f"| {r['loader']} | {r['cores']} | {r['threads']} | {r['workers']} | "
            f"{r['images_per_s']:.0f} | {r['images_per_s_per_core']:.0f} | "
            f"{r['images_per_cpu_s']:.0f} |"
        )
    return "\n".join(lines)


def render(path: str) -> str:
    """The block docs/benchmarks.md pastes for one JSON file: its path, then its table."""
    with open(path) as f:
        doc = json.load(f)
    if "variants" in doc:
        table = step_table(doc)
    elif "dataset" in doc:
        table = input_table(doc)
    else:
        table = allreduce_table(doc)
    return f"From `{path}`.\n\n{table}\n"


def main(paths: list[str]) -> None:
    for path in paths:
        print(render(path))


if __name__ == "__main__":
    main(sys.argv[1:])
