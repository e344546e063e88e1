r"""Bus bandwidth of the gradient all-reduce strategies, next to one plain all-reduce.

Times the mean of a per-device gradient pytree over every device, the way the trainer reduces
its gradients, for each wire dtype, mesh shape (1 x n and 2 x n/2), payload and strategy:

  * payloads: one flat buffer of each `--sizes_mib` (one leaf, so one bucket), and the parameter
    tree of `--tree_model` (ResNet-50: 161 leaves, 25.6M values) fused into buckets of each
    `--bucket_mib`;
  * strategies: `xla` (the trainer's comm.strategy='xla': per-leaf means written as array code,
    XLA chooses and combines the all-reduces) and `flat`, `hierarchical`, `hybrid`
    (`jia_jax.allreduce.reduce_gradients` inside `jax.shard_map`);
  * peer `plain`: one `psum` of one flat buffer of the payload's bytes over all devices, i.e. what
    one NCCL all-reduce gives. `ratio` = bus bandwidth of the row / bus bandwidth of `plain`
    (1.0: as fast as one all-reduce of the same bytes; the strategies also pack, divide, unpack).

Leaves are in the wire dtype, so every row of a payload moves the same bytes. Bus bandwidth is
`2 (n - 1) / n * bytes / time` (nccl-tests' convention, comparable across device counts). Time
per call: compile, two warm-up calls, then the median of `--repeats` samples, each of several
back-to-back calls (async dispatch keeps the devices busy) and one `block_until_ready`. Each case
is guarded: an error is recorded and the run goes on; past `--budget_s` the remaining cases are
recorded as skipped. The JSON is rewritten after every case, so a killed run leaves its results.

Run from the repository root. The default list is ~170 programs; compiling them dominates the
run time (seconds each for the model tree), so give it a `--budget_s`:

  python -m scripts.bench.allreduce --out=/tmp/bench_allreduce.json --budget_s=150

On CPU with 8 simulated devices and tiny sizes:

  XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu \
      python -m scripts.bench.allreduce --sizes_mib=0.01,0.1 --bucket_mib=0.01 --model_width=8 \
      --out=/tmp/bench_allreduce.json
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from jia_jax import allreduce
from jia_jax import mesh as mesh_lib
from jia_jax import models
from scripts.bench import harness
from scripts.bench.allreduce_programs import PLAIN, Case, Payload, is_shape, reducer
from scripts.bench.allreduce_programs import looped_reducer, stacked_inputs

MIB = 1 << 20
STRATEGIES = ("xla", *allreduce.STRATEGIES)


def bus_bandwidth(nbytes: int, seconds: float, devices: int) -> float:
    """All-reduce bus bandwidth in bytes/s, nccl-tests' `2 (n - 1) / n * bytes / time`."""
    return 2 * (devices - 1) / devices * nbytes / seconds


def model_param_shapes(name: str, width: int | None) -> Any:
    """Pytree of the parameter shapes of a `jia_jax.models` classifier (1000 classes)."""
    model = models.create_model(
        name, num_classes=1000, dtype=jnp.bfloat16, **({"width": width} if width else {})
    )
    # Abstract only: no memory, any width. Parameter shapes do not depend on the image size.
    variables = jax.eval_shape(
        lambda key: model.init(key, jnp.zeros((1, 224, 224, 3), jnp.float32), train=False),
        jax.random.key(0),
    )
    return jax.tree.map(lambda x: tuple(x.shape), variables["params"])


def build_cases(
    tree: Payload | None,
    flat_bytes: Sequence[int],
    dtypes: Sequence[str],
    meshes: Sequence[tuple[int, int]],
    strategies: Sequence[str],
) -> list[Case]:
    """All cases, grouped by (payload, dtype, mesh) with the `plain` peer first in each group.

    The model tree comes first: it is what the trainer reduces, so a run cut short by its budget
    still has it. A flat buffer of `b` bytes holds `b / itemsize` elements of the wire dtype and is
    one bucket.
    """
    groups = [(tree, dtype) for dtype in dtypes] if tree else []
    for b in flat_bytes:
        for dtype in dtypes:
            itemsize = jnp.dtype(dtype).itemsize
            elements = b // itemsize
            groups.append(
                (Payload(f"flat {b / MIB:.3g}M", (elements,), (elements * itemsize,)), dtype)
            )
    cases = []
    for payload, dtype in groups:
        for mesh in meshes:
            cases.append(Case(dtype, mesh, payload, PLAIN, None))
            for strategy in strategies:
                buckets = (None,) if strategy == "xla" else payload.bucket_bytes
                cases.extend(Case(dtype, mesh, payload, strategy, b) for b in buckets)
    return cases


def run_cases(
    cases: Sequence[Case],
    crossover_bytes: int,
    repeats: int,
    min_sample_s: float,
    budget_s: float,
    extra_iterations: int,
    on_result: Callable[[dict[str, Any]], None],
) -> None:
    """Measures `cases` in order and hands each result row to `on_result`."""
    start = time.perf_counter()
    meshes: dict[tuple[int, int], jax.sharding.Mesh] = {}
    inputs_key, inputs, arg = None, None, None
    plain_times: dict[tuple, float] = {}
    for case in cases:
        payload_bytes = case.payload.num_elements() * jnp.dtype(case.dtype).itemsize
        row = {
            "dtype": case.dtype,
            "mesh": f"{case.mesh[0]}x{case.mesh[1]}",
            "payload": case.payload.name,
            "payload_bytes": payload_bytes,
            "leaves": len(case.payload.leaf_shapes()),
            "strategy": case.strategy,
            "bucket_bytes": case.bucket_bytes,
        }
        if time.perf_counter() - start > budget_s:
            on_result({**row, "skipped": "budget_s exceeded"})
            continue
        try:
            if case.mesh not in meshes:
                meshes[case.mesh] = mesh_lib.create_mesh(*case.mesh)
            mesh = meshes[case.mesh]
            arg = None  # drop the previous case's reference before making new buffers
            if case.strategy == PLAIN:
                arg = stacked_inputs((case.payload.num_elements(),), case.dtype, mesh, seed=1)
            else:
                if inputs_key != case.key():
                    inputs_key, inputs = case.key(), None
                    inputs = stacked_inputs(case.payload.shapes, case.dtype, mesh, seed=0)
                arg = inputs
            if case.bucket_bytes is not None:
                abstract = jax.tree.map(
                    lambda s: jax.ShapeDtypeStruct(s, case.dtype),
                    case.payload.shapes,
                    is_leaf=is_shape,
                )
                plan = allreduce.plan_buckets(abstract, case.bucket_bytes, case.dtype)
                row["buckets"] = len(plan.buckets)
            per_call = harness.time_calls(
                reducer(case, mesh, crossover_bytes), arg, repeats, min_sample_s
            )
            timing = harness.time_in_program(
                looped_reducer(case, mesh, crossover_bytes), arg, repeats, extra_iterations
            )
            devices = mesh.devices.size
            row.update(timing)
            # One call of a jitted function of the tree: what a benchmark of calls measures,
            # host dispatch of every argument and result buffer included.
            row["call_time_s"] = per_call.pop("time_s")
            row.update({f"call_{k}": v for k, v in per_call.items()})
            row["busbw_gbps"] = bus_bandwidth(payload_bytes, timing["time_s"], devices) / 1e9
            if case.strategy == PLAIN:
                plain_times[case.key()] = timing["time_s"]
            plain = plain_times.get(case.key())
            row["ratio"] = plain / timing["time_s"] if plain else None
        except Exception as e:  # pylint: disable=broad-except
            # One failing case (e.g. out of memory) must not lose the others.
            row["error"] = harness.error_text(e)
        on_result(row)


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """A compact text table of the measured and failed rows, then the count of skipped ones."""
    lines = [
        f"{'dtype':<9}{'mesh':>5} {'payload':<14}{'bucket':>9} {'strategy':<13}"
        f"{'buckets':>7}{'time_us':>10}{'busbw_GB/s':>11}{'ratio':>7}{'call_us':>10}"
    ]
    for r in rows:
        if "skipped" in r:
            continue
        bucket = "" if r["bucket_bytes"] is None else f"{r['bucket_bytes'] / MIB:.3g}M"
        if "time_s" in r:
            ratio = "" if r.get("ratio") is None else f"{r['ratio']:.2f}"
            nums = (
                f"{r['time_s'] * 1e6:>10.1f}{r['busbw_gbps']:>11.2f}{ratio:>7}"
                f"{r['call_time_s'] * 1e6:>10.1f}"
            )
        else:
            nums = f"  {r['error'][:80]}"
        lines.append(
            f"{r['dtype']:<9}{r['mesh']:>5} {r['payload']:<14}{bucket:>9} "
            f"{r['strategy']:<13}{r.get('buckets', ''):>7}{nums}"
        )
    skipped = sum("skipped" in r for r in rows)
    if skipped:
        lines.append(f"... and {skipped} cases skipped: past --budget_s")
    return "\n".join(lines)


def default_meshes(devices: int) -> list[tuple[int, int]]:
    """1 x n, and 2 x n/2 where n is even."""
    return [(1, devices)] + ([(2, devices // 2)] if devices % 2 == 0 and devices >= 4 else [])


def parse_mesh(text: str) -> tuple[int, int]:
    node, gpu = (int(v) for v in text.lower().split("x"))
    return node, gpu


def _add_payload_args(parser: argparse.ArgumentParser) -> None:
    """What is reduced: strategies, payloads, wire dtypes, meshes."""
    parser.add_argument(
        "--strategies",
        type=harness.strings,
        default=list(STRATEGIES),
        help=f"comma-separated subset of {','.join(STRATEGIES)}",
    )
    parser.add_argument(
        "--sizes_mib",
        type=harness.floats,
        default=[1, 4, 16, 64, 256],
        help="flat-buffer payload sizes (MiB in the wire dtype)",
    )
    parser.add_argument(
        "--bucket_mib",
        type=harness.floats,
        default=[1, 4, 16, 64, 256],
        help="comm.bucket_bytes values (MiB) for the model-tree payload",
    )
    parser.add_argument("--dtypes", type=harness.strings, default=["float32", "bfloat16"])
    parser.add_argument(
        "--meshes",
        type=harness.strings,
        default=None,
        help="e.g. 1x4,2x2 (default: 1xn and 2x(n/2) for n devices)",
    )
    parser.add_argument(
        "--tree_model",
        default="resnet50",
        help="model whose parameter tree is a payload; empty for none",
    )
    parser.add_argument(
        "--model_width",
        type=int,
        default=None,
        help="override the model's width (tiny trees for CPU runs)",
    )
    parser.add_argument("--hybrid_crossover_mib", type=float, default=4.0)


def _add_timing_args(parser: argparse.ArgumentParser) -> None:
    """How each case is timed, how long the run may take, where the JSON goes."""
    parser.add_argument("--repeats", type=int, default=10, help="timed samples per case")
    parser.add_argument(
        "--min_sample_ms",
        type=float,
        default=5.0,
        help="back-to-back calls per sample to last at least this long",
    )
    parser.add_argument(
        "--budget_s",
        type=float,
        default=float("inf"),
        help="skip the remaining cases once this many seconds have passed",
    )
    parser.add_argument(
        "--extra_iterations",
        type=int,
        default=8,
        help="k: each reduction's device time is (t(1 + k iterations) - t(1)) / k in one program",
    )
    parser.add_argument("--out", default="bench_allreduce.json")


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[tuple[int, int]]]:
    """The checked arguments and the meshes to measure on; exits on bad ones."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    _add_payload_args(parser)
    _add_timing_args(parser)
    args = parser.parse_args(argv)
    unknown = set(args.strategies) - set(STRATEGIES)
    if unknown:
        parser.error(f"unknown strategies {sorted(unknown)}; choose from {STRATEGIES}")

    devices = jax.device_count()
    if devices < 2:
        parser.error(f"an all-reduce needs at least 2 devices, found {devices}")
    meshes = [parse_mesh(m) for m in args.meshes] if args.meshes else default_meshes(devices)
    if any(node * gpu != devices for node, gpu in meshes):
        parser.error(f"every mesh must span all {devices} devices, got {args.meshes}")
    return args, meshes


def cases_of_args(args: argparse.Namespace, meshes: Sequence[tuple[int, int]]) -> list[Case]:
    """The cases the arguments ask for: the model tree (if any), then the flat buffers."""
    tree = None
    if args.tree_model:
        tree = Payload(
            args.tree_model,
            model_param_shapes(args.tree_model, args.model_width),
            tuple(int(b * MIB) for b in args.bucket_mib),
        )
    return build_cases(
        tree, [int(mib * MIB) for mib in args.sizes_mib], args.dtypes, meshes, args.strategies
    )


def result_recorder(
    doc: dict[str, Any], out: str, num_cases: int
) -> Callable[[dict[str, Any]], None]:
    """`on_result` for `run_cases`: appends the row to `doc`, rewrites `out`, prints a line."""

    def on_result(row: dict[str, Any]) -> None:
        doc["results"].append(row)
        harness.write_json(out, doc)
        status = (
            f"{row['time_s'] * 1e6:.1f} us, {row['busbw_gbps']:.2f} GB/s"
            if "time_s" in row
            else row.get("error") or row.get("skipped")
        )
        print(
            f"[{len(doc['results'])}/{num_cases}] {row['dtype']} {row['mesh']} {row['payload']} "
            f"{row['strategy']} bucket={row['bucket_bytes']}: {status}",
            flush=True,
        )

    return on_result


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Runs the benchmark; returns (and writes to `--out`) the JSON document."""
    args, meshes = parse_args(argv)
    cases = cases_of_args(args, meshes)
    doc: dict[str, Any] = {"environment": harness.environment(), "args": vars(args), "results": []}
    run_cases(
        cases,
        int(args.hybrid_crossover_mib * MIB),
        args.repeats,
        args.min_sample_ms / 1e3,
        args.budget_s,
        args.extra_iterations,
        result_recorder(doc, args.out, len(cases)),
    )
    env = doc["environment"]
    print(
        f"\n{env['device_count']} x {env['device_kind']}, jax {env['jax_version']}, "
        f"git {env['git_rev'][:12]}; ratio = busbw / busbw(plain psum of the same bytes)"
    )
    print(format_table(doc["results"]))
    return doc


if __name__ == "__main__":
    main()
