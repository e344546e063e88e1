r"""Which of a traced step's XLA kernels run far below the memory bandwidth their bytes need.

A kernel XLA generates is named after its fusion (`input_reduce_fusion_180` runs
`%input_reduce_fusion.180`, and every instruction calling the same fused computation runs the same
kernel). The optimized HLO (`scripts.bench.profile_step --hlo_dir`) gives each fusion's operand
and result shapes: the bytes one launch reads and writes, if it reads each operand once. Joined
with the trace's kernel durations that gives each kernel's achieved GB/s, and the time it takes
beyond what its bytes need at a reference bandwidth (`excess`): where a memory-bound step loses
time to compute-bound passes. Convolutions and GEMMs (cuDNN, cuBLAS) have no fusion and are left
out.

  python -m scripts.bench.kernel_bandwidth --profile=docs/benchmarks/profile_x.json \
      --case=resnet50:1x1:xla:256 --hlo=/tmp/hlo/resnet50_1x1_xla_256.hlo.gz
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import re
from collections.abc import Sequence
from typing import Any

# Bytes per element of the HLO types a step's fusions use.
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "f32": 4}
_BYTES.update({"s64": 8, "u64": 8, "f64": 8})
_ARRAY = re.compile(r"\b(" + "|".join(_BYTES) + r")\[([\d,]*)\]")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%(\S+) = (.*?) ([\w-]+)\((.*)$")
_OP_NAME = re.compile(r'op_name="([^"]*)"')


def array_bytes(shape_text: str) -> int:
    """Bytes of every array in an HLO shape (a tuple's elements summed)."""
    return sum(
        _BYTES[dtype] * math.prod(int(d) for d in dims.split(",") if d)
        for dtype, dims in _ARRAY.findall(shape_text)
    )


def fusion_bytes(hlo_text: str) -> dict[str, dict[str, Any]]:
    """Kernel name -> bytes read and written by one launch, and the JAX op it came from, for
    each fusion of the entry computation (the kernel name is the fusion's, dots as underscores)."""
    entry = hlo_text[hlo_text.find("\nENTRY") :]
    entry = entry[: entry.find("\n}\n")]
    sizes: dict[str, int] = {}
    out: dict[str, dict[str, Any]] = {}
    for line in entry.splitlines():
        m = _INSTRUCTION.match(line)
        if not m:
            continue
        name, shape, op, rest = m.groups()
        sizes[name] = array_bytes(shape)
        if op != "fusion":
            continue
        operands = re.findall(r"%([\w.\-]+)", rest[: rest.find(")")])
        op_name = _OP_NAME.search(line)
        out.setdefault(
            name.replace(".", "_"),
            {
                "read": sum(sizes.get(o, 0) for o in operands),
                "written": sizes[name],
                "op": op_name.group(1) if op_name else "",
            },
        )
    return out


def kernel_rows(
    kernels: Sequence[Sequence[Any]], fusions: dict[str, dict[str, Any]], steps: int, gb_s: float
) -> list[dict[str, Any]]:
    """Per fusion kernel of the trace: launches and µs per step, GB/s, and µs beyond its bytes at
    `gb_s`; slowest excess first. `kernels` are profile_step's (name, start, end, ...) records."""
    totals: dict[str, list[float]] = {}
    for name, start, end, *_ in kernels:
        if name in fusions:
            t = totals.setdefault(name, [0, 0.0])
            t[0] += 1
            t[1] += end - start
    rows = []
    for name, (count, us) in totals.items():
        moved = (fusions[name]["read"] + fusions[name]["written"]) * count / steps
        us_step = us / steps
        rows.append(
            {
                "kernel": name,
                "op": fusions[name]["op"],
                "launches_per_step": count / steps,
                "us_per_step": us_step,
                "mb_per_step": moved / 1e6,
                "gb_per_s": moved / us_step / 1e3,
                "excess_us": us_step - moved / gb_s / 1e3,
            }
        )
    return sorted(rows, key=lambda r: -r["excess_us"])


def case_rows(profile: str, case: str, hlo: str, gb_s: float) -> list[dict[str, Any]]:
    """`kernel_rows` of one case of a profile_step record and that case's optimized HLO."""
    with open(profile) as f:
        doc = json.load(f)
    row = next(r for r in doc["results"] if ":".join(str(v) for v in _case(r)) == case)
    with gzip.open(f"{profile}.kernels.json.gz", "rt") as f:
        records = json.load(f)[case]
    (kernels,) = records.values()
    with gzip.open(hlo, "rt") as f:
        fusions = fusion_bytes(f.read())
    return kernel_rows(kernels, fusions, row["traced_steps"], gb_s)


def _case(row: dict[str, Any]) -> tuple:
    return row["model"], row["mesh"], row["strategy"], row["per_device_batch"]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", required=True, help="a scripts.bench.profile_step record")
    parser.add_argument("--case", required=True, help="model:mesh:strategy:batch of the record")
    parser.add_argument("--hlo", required=True, help="that case's optimized HLO (.hlo.gz)")
    parser.add_argument("--gb_s", type=float, default=3000.0, help="reference bandwidth")
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args(argv)
    for r in case_rows(args.profile, args.case, args.hlo, args.gb_s)[: args.top]:
        print(
            f"{r['excess_us']:8.1f} {r['us_per_step']:8.1f} {r['launches_per_step']:5.1f} "
            f"{r['mb_per_step']:8.0f} MB {r['gb_per_s']:6.0f} GB/s  {r['kernel']}  {r['op'][-60:]}"
        )


if __name__ == "__main__":
    main()
