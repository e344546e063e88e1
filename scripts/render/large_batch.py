"""The table of docs/large_batch.md, from what `scripts/large_batch_digits.py` writes (its `--json`,
or the rows and provenance it has just measured)."""

from __future__ import annotations

from typing import Any


def table(rows: list[dict[str, Any]], meta: dict[str, str]) -> str:
    """One line per recipe (top-1 as mean ± sample std over seeds, then each seed's value), then
    the provenance."""
    baseline = rows[0]["mean_top1"]
    lines = [
        "| recipe | batch | optimizer | peak LR | warmup (epochs) | decay | steps | "
        "test top-1 % (mean ± std) | vs first row (points) | per seed | s / run |",
        "| --- | ---: | --- | ---: | ---: | --- | ---: | ---: | ---: | --- | ---: |",
    ]
    for row in rows:
        optimizer = row["optimizer"]
        if row["trust_coefficient"] is not None:
            optimizer += f" (η={row['trust_coefficient']:g})"
        per_seed = ", ".join(f"{100 * t:.2f}" for t in row["top1"])
        lines.append(
            f"| {row['recipe']} | {row['batch']} | {optimizer} | {row['peak_lr']:.4g} | "
            f"{row['warmup_epochs']:g} | {row['decay']} | {row['steps']} | "
            f"{100 * row['mean_top1']:.2f} ± {100 * row['std_top1']:.2f} | "
            f"{100 * (row['mean_top1'] - baseline):+.2f} | {per_seed} | {row['mean_seconds']:.0f} |"
        )
    lines += [
        "",
        f"Command as run (a record; its output paths may have moved since): `{meta['command']}`  ",
        f"Commit: `{meta['commit']}`  ",
        f"Machine: {meta['machine']}",
    ]
    return "\n".join(lines) + "\n"
