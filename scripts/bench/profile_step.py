r"""Where the time of the trainer's step goes: a `jax.profiler` trace, summarised.

For each `--cases` entry (`model:mesh:strategy:per_device_batch[:wire dtype]`, e.g.
`resnet50:1x2:hierarchical:64`, computing in `--compute_dtype`: bf16 unless set, and in
another dtype named `<case> (<dtype>)` in the record) this builds the trainer's own step
(`scripts/bench/trainer_step.py`), compiles it as the trainer would (its convolutions in command
buffers where `launch.convolution_graphs` says: the row's `convolution_graphs`), times it synced
and queued, traces `--trace_steps` queued steps and reports per GPU: busy time by kernel kind,
collective time overlapped with compute or exposed, idle time (the device waiting for the host),
kernels per step, the top kernels, and where the compiled schedule places each collective's
start and done among the compute instructions; `scripts/bench/plot_profile.py` draws a case's
timeline from the `<out>.kernels.json.gz` it writes.

  python -m scripts.bench.profile_step --cases=resnet50:1x1:xla:64,resnet50:1x2:hierarchical:64 \
      --out=/tmp/profile.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import statistics
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import jax

from jia_jax import step_graphs, train
from scripts.bench import harness, host_trace, profile_trace, trainer_step

# `%name = <shape> all-reduce-start(` (op name right before its parenthesis, never an operand).
_ASYNC = re.compile(
    r"^\s*(?:ROOT )?%?(\S+) = .*?\b(all-reduce|reduce-scatter|all-gather)-(start|done)\("
)
_ASYNC_WRAPPED = re.compile(
    r"^\s*(?:ROOT )?%?(\S+) = .*?\basync-(start|done)\(.*?(reduce-scatter|all-gather|all-reduce)"
)
_COMPUTE = re.compile(r"^\s*(?:ROOT )?%?\S+ = .*?\b(fusion|custom-call|convolution)\(")


def collective_schedule(hlo_text: str) -> list[dict[str, Any]]:
    """Each async collective in the entry computation's schedule, and the compute between.

    The optimized HLO lists the entry computation's instructions in execution order; a
    collective overlaps compute only if fusions / custom calls (cuDNN convolutions, GEMMs) are
    scheduled between its start and its done.
    """
    starts: dict[str, int] = {}
    out, compute_seen = [], 0
    for line in harness.entry_lines(hlo_text):
        if _COMPUTE.match(line):
            compute_seen += 1
            continue
        m = _ASYNC.match(line)
        if m:
            name, op, phase = m.group(1), m.group(2), m.group(3)
        else:
            w = _ASYNC_WRAPPED.match(line)
            if not w:
                continue
            name, phase, op = w.group(1), w.group(2), w.group(3)
        if phase == "start":
            starts[name] = compute_seen
        else:
            operands = re.findall(r"%([\w.\-]+)", line[line.find("done(") :])
            begun = starts.get(operands[0] if operands else "", compute_seen)
            out.append(
                {"op": op, "start_after_compute": begun, "compute_overlapped": compute_seen - begun}
            )
    return out


def parse_case(text: str) -> dict[str, Any]:
    """`model:mesh:strategy:batch[:wire[:bucket MiB]]` -> its fields."""
    parts = text.split(":")
    if len(parts) not in (4, 5, 6):
        raise ValueError(
            f"case {text!r} is not model:mesh:strategy:per_device_batch[:wire[:bucket_mib]]"
        )
    model, mesh, strategy, batch = parts[:4]
    return {
        "model": model,
        "mesh": mesh,
        "strategy": strategy,
        "per_device_batch": int(batch),
        "wire": parts[4] if len(parts) >= 5 and parts[4] else None,
        "bucket_mib": float(parts[5]) if len(parts) == 6 else None,
    }


def write_hlo(hlo_dir: str, case: dict[str, Any], hlo_text: str) -> str:
    """Writes a case's optimized HLO to `hlo_dir` (created if absent) as
    ``model_mesh_strategy_batch[_dtype].hlo.gz``, for `kernel_bandwidth`'s bytes per kernel; its
    path."""
    name = "_".join(str(case[k]) for k in ("model", "mesh", "strategy", "per_device_batch"))
    name += f"_{case['variant']}" if case.get("variant") else ""  # another compute dtype's
    os.makedirs(hlo_dir, exist_ok=True)
    path = os.path.join(hlo_dir, f"{name}.hlo.gz")
    with gzip.open(path, "wt") as f:
        f.write(hlo_text)
    return path


def profile_case(case: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Compiles, times and traces one case; returns its row with per-device summaries."""
    devices = jax.devices()
    node, gpu = (int(v) for v in case["mesh"].split("x"))
    config = trainer_step.make_config(
        case["model"],
        case["strategy"],
        node,
        gpu,
        bucket_mib=case["bucket_mib"] or args.bucket_mib,
        per_device_batch_override=case["per_device_batch"],
        image_size=args.image_size,
        model_width=args.model_width,
        small_inputs=args.small_inputs,
        comm_dtype=case["wire"],
        compute_dtype=args.compute_dtype,
        model_options=args.model_options,
    )
    setup = trainer_step.build_setup(config, devices)
    state = setup["init"]()
    step = train.make_train_step(
        setup["model"], setup["tx"], setup["schedule"], config, setup["mesh"]
    )
    start = time.perf_counter()
    lowered = step.lower(state, setup["batch"])
    # As the trainer runs it: its convolutions in command buffers where it would launch them so.
    compiled, state, graphs = step_graphs.compile_like_training(
        lowered, config.launch.convolution_graphs, state, setup["batch"]
    )
    row: dict[str, Any] = {
        **case, "compile_s": time.perf_counter() - start, "convolution_graphs": graphs
    }
    hlo_text = compiled.as_text()
    row["schedule"] = collective_schedule(hlo_text)
    if args.hlo_dir:
        write_hlo(args.hlo_dir, case, hlo_text)
    batch = setup["batch"]
    state, synced, queued = harness.time_train_step(compiled, state, batch, args.steps, 3)
    row["synced_step_s"], row["queued_step_s"] = (
        statistics.median(synced),
        statistics.median(queued),
    )
    log_dir = tempfile.mkdtemp(prefix="jia_jax_trace_")
    jax.block_until_ready(state)
    with jax.profiler.trace(log_dir):
        # Queued timing runs two steps more than it times: the trace holds trace_steps + 2.
        state, _ = harness.time_steps(compiled, state, batch, args.trace_steps, queued=True)
    traced = args.trace_steps + 2
    events = profile_trace.load_events(log_dir)
    kernels = profile_trace.device_kernels(events)
    row["devices"] = {
        dev: {
            **profile_trace.summarize(ks, traced),
            "top": profile_trace.top_kernels(ks, traced),
        }
        for dev, ks in kernels.items()
    }
    # The host's time in the step's calls (the trainer's `launch`), by what it spends it on.
    row["host"] = host_trace.breakdown(events, traced)
    row["trace_dir"], row["traced_steps"] = log_dir, traced
    row["kernels"] = {
        dev: [(k.name[:80], k.start_us, k.end_us, k.stream, k.kind) for k in ks]
        for dev, ks in kernels.items()
    }
    return row


def format_rows(rows: Sequence[dict[str, Any]]) -> str:
    """One line per case and device: the step's time split."""
    lines = [
        f"{'case':<36}{'dev':>4}{'sync ms':>9}{'queue ms':>9}{'span':>8}{'idle':>7}{'conv':>7}"
        f"{'fusion':>8}{'cat/sl':>7}{'coll':>7}{'exposed':>8}{'kern':>6}"
    ]
    for r in rows:
        name = ":".join(
            str(r[k] or "") for k in ("model", "mesh", "strategy", "per_device_batch", "wire")
        ) + (f":{r['bucket_mib']:g}" if r.get("bucket_mib") else "")
        if "error" in r:
            lines.append(f"{name:<36} {r['error'][:150]}")
            continue
        for dev, d in sorted(r["devices"].items()):
            lines.append(
                f"{name:<36}{dev[-1]:>4}{r['synced_step_s'] * 1e3:>9.2f}"
                f"{r['queued_step_s'] * 1e3:>9.2f}{d['span_us'] / 1e3:>8.2f}{d['idle_us'] / 1e3:>7.2f}"
                f"{d['busy_conv/gemm_us'] / 1e3:>7.2f}{d['busy_fusion_us'] / 1e3:>8.2f}"
                f"{d['busy_concat/slice_us'] / 1e3:>7.2f}{d['busy_collective_us'] / 1e3:>7.2f}"
                f"{d['collective_exposed_us'] / 1e3:>8.2f}{d['kernels_per_step']:>6.0f}"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cases", required=True, help="comma-separated model:mesh:strategy:batch[:wire]"
    )
    parser.add_argument("--bucket_mib", type=float, default=16.0)
    parser.add_argument("--image_size", type=int, default=224)
    parser.add_argument("--model_width", type=int, default=None, help="tiny models for CPU runs")
    parser.add_argument("--small_inputs", action="store_true")
    parser.add_argument(
        "--model_options", type=harness.strings, default=[],
        help="comma-separated model.* options for every case, e.g. space_to_depth_stem (no_: off)",
    )
    parser.add_argument(
        "--compute_dtype", default="bfloat16", help="precision.compute of every case"
    )
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--trace_steps", type=int, default=5)
    parser.add_argument("--out", default="profile_step.json")
    parser.add_argument("--hlo_dir", default="", help="write each case's optimized HLO here")
    args = parser.parse_args(argv)
    doc: dict[str, Any] = {"environment": harness.environment(), "args": vars(args)}
    rows: list[dict[str, Any]] = []
    all_kernels: dict[str, Any] = {}
    for text in args.cases.split(","):
        case = parse_case(text)
        if args.compute_dtype != "bfloat16":  # the config's: named where another replaces it
            case["variant"] = args.compute_dtype
            text = f"{text} ({args.compute_dtype})"
        try:
            rows.append(profile_case(case, args))
        except Exception as e:  # pylint: disable=broad-except
            rows.append({**case, "error": harness.error_text(e)})
        # Kernel lists go to their own file: the picture is drawn from them, the summary stays small.
        all_kernels[text] = rows[-1].pop("kernels", None)
        with gzip.open(f"{args.out}.kernels.json.gz", "wt") as f:
            json.dump(all_kernels, f)
        doc["results"] = rows
        harness.write_json(args.out, doc)
        print(format_rows(rows[-1:]), flush=True)
    print(format_rows(rows))
    return rows


if __name__ == "__main__":
    main()
