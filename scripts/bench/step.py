r"""Train-step time, images/s and weak-scaling efficiency of the trainer's own step program.

Each case builds the step exactly as `jia_jax.loop` does (`configs/resnet50_64k.py`, or
`configs/alexnet_bn_64k.py` for AlexNet-BN, with synthetic data and the overrides below), on a mesh
of 1x1 (one device: the weak-scaling baseline), 1xn or 2x(n/2) over the n devices, for each
`comm.strategy` and bucket size. The per-device batch is fixed, so the global batch grows with the
mesh, and weak-scaling efficiency = (images/s on n devices) / (n * images/s on 1 device)
= step time on 1 device / step time on n devices.

Timing: the init and the step are compiled, `--warmup_steps` steps run, then `--steps` steps
synced (each waited for before the next is dispatched) and `--steps` steps queued (one step in
flight ahead; the training loop keeps two: step t+1 is dispatched before step t's metrics are
fetched; a sample is the time between two completions, and the queue never drains). The 2xH100
JSONs in docs/benchmarks/ were timed by an earlier version that drained the queue every 5 steps
(docs/benchmarks.md says what that costs). `step_time_s`, `images_per_s` and `efficiency` are the
queued medians (what training sees); `synced_*` are the synced ones.

Peers (`--strategies` may name them): `peer_ad_psum`, `peer_ad_psum_raveled` and
`peer_concat_buckets` (`scripts/bench/peer_steps.py`) run the trainer's forward/backward and
update with the gradient mean written as others write it, in the same run, on 1xn meshes.
On one host a 2x(n/2) mesh reduces over the same devices as 1xn, so the strategies that do not
treat the node axis apart (`xla`, `flat`) run on 1xn only when both meshes are asked for.

Processes: XLA reads XLA_FLAGS once, at start-up, so the measurements run in child processes of this
script (`harness.run_children`): one with the inherited flags for all cases, then, for each
`--xla_flags_variant`, one per model re-running that model's fastest multi-device case with those
flags appended (`speedup_vs_default` compares the two; a variant's `efficiency` is against the
default 1x1 row). A child that dies loses only the case it was running: a new child goes on with the
rest. Cases run in a round-robin over the models, each model's 1x1 baseline first; once a case would
end past the budget it and the rest are recorded as skipped (`--budget_s` covers everything, of
which `--variant_budget_s` is kept for the variants). Each child rewrites its rows to
`<out>.default.json` / `<out>.variant<i>.json` after every case (merged into `--out` and removed at
the end), so even a killed run leaves its measurements.

Run from the repository root. On 4 GPUs the default list (14 cases) is estimated at about 6
minutes, mostly compiles (ResNet-50 30-60 s each, AlexNet-BN 10-20 s), `--quick` (6 cases) at
about 3; `--budget_s` bounds it whatever the compile times turn out to be:

  python -m scripts.bench.step --out=/tmp/bench_step.json \
      --xla_flags_variant=--xla_gpu_enable_latency_hiding_scheduler=true

On CPU with 8 simulated devices and a tiny model:

  XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu \
      python -m scripts.bench.step --models=resnet50 --model_width=8 --small_inputs \
      --image_size=32 --per_device_batch=2 --bucket_mib=0.01 --out=/tmp/bench_step.json
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import re
import time
from collections.abc import Sequence
from typing import Any

import jax

from jia_jax import mesh as mesh_lib
from jia_jax import train
from scripts.bench import harness, peer_steps, trainer_step

STRATEGIES = ("xla", "flat", "hierarchical", "hybrid", "auto", *peer_steps.PEERS)
# Strategies that reduce over the node axis separately; the others see a 2-D mesh as 1-D.
NODE_AWARE = ("hierarchical", "hybrid")
MESHES = ("1x1", "1xn", "2xn/2")
_COLLECTIVE = re.compile(r"\b(all-reduce|reduce-scatter|all-gather)(?:-start)?\(")


@dataclasses.dataclass(frozen=True)
class Case:
    """One measurement: a model's train step on a mesh with a gradient-reduction strategy."""

    model: str
    mesh: str  # one of MESHES
    strategy: str
    bucket_mib: float | None  # comm.bucket_bytes in MiB; None: `xla` (no buckets)


def build_cases(
    models: Sequence[str],
    meshes: Sequence[str],
    strategies: Sequence[str],
    bucket_mib: Sequence[float],
) -> list[Case]:
    """The case list: each model's 1x1 baseline first, then its multi-device cases; round-robin
    over the models, so a run cut short by its budget has some of every model."""
    per_model = []
    for model in models:
        cases = [Case(model, "1x1", "xla", None)] if "1x1" in meshes else []
        for strategy in strategies:
            for mesh in (m for m in meshes if m != "1x1"):
                if mesh == "2xn/2" and (
                    strategy in peer_steps.PEERS
                    or ("1xn" in meshes and strategy not in (*NODE_AWARE, "auto"))
                ):
                    continue
                unbucketed = strategy in ("xla", "auto") or strategy.startswith("peer_ad")
                buckets = (None,) if unbucketed else bucket_mib
                cases.extend(Case(model, mesh, strategy, b) for b in buckets)
        per_model.append(cases)
    longest = max((len(c) for c in per_model), default=0)
    return [cases[i] for i in range(longest) for cases in per_model if i < len(cases)]


def mesh_shape(mesh: str, devices: int) -> tuple[int, int]:
    """(node, gpu) of a mesh name for `devices` devices."""
    if mesh == "1x1":
        return 1, 1
    if mesh == "1xn":
        return 1, devices
    if devices % 2:
        raise ValueError(f"mesh 2xn/2 needs an even device count, found {devices}")
    return 2, devices // 2


def run_case(fields: dict[str, Any], args: argparse.Namespace, cache: dict[str, Any]) -> dict:
    """Compiles and times one case (`Case` fields); returns its result row's measured fields.

    `cache` (the child's) keeps the (model, mesh) setup of the previous case and each model's
    initial state on the host: it is the same on every mesh (same seed, replicated), so the init
    compiles once per model instead of once per mesh.
    """
    case = Case(**fields)
    devices = jax.devices()
    setups = cache.setdefault("setups", {})
    host_states = cache.setdefault("host_states", {})
    node, gpu = mesh_shape(case.mesh, len(devices))
    config = trainer_step.make_config(
        case.model,
        case.strategy,
        node,
        gpu,
        bucket_mib=case.bucket_mib,
        per_device_batch_override=args.per_device_batch,
        **{k: getattr(args, k) for k in trainer_step.OVERRIDES},
    )
    row: dict[str, Any] = {
        "mesh_shape": f"{node}x{gpu}",
        "devices": node * gpu,
        "per_device_batch": config.global_batch_size // (node * gpu),
        "global_batch": config.global_batch_size,
        "comm_dtype": config.comm.dtype,
    }
    start = time.perf_counter()
    key = (case.model, node, gpu)
    if key not in setups:
        setups.clear()  # one setup at a time: its batch holds device memory
        setups[key] = trainer_step.build_setup(config, devices)
    setup = setups[key]
    if case.model not in host_states:
        host_states[case.model] = jax.device_get(setup["init"]())
    # A fresh copy per case: the step donates its input state.
    state = jax.block_until_ready(
        jax.device_put(host_states[case.model], mesh_lib.replicated_sharding(setup["mesh"]))
    )
    row["init_s"] = time.perf_counter() - start

    make = (
        functools.partial(peer_steps.make_peer_step, case.strategy)
        if case.strategy in peer_steps.PEERS
        else train.make_train_step
    )
    step = make(setup["model"], setup["tx"], setup["schedule"], config, setup["mesh"])
    start = time.perf_counter()
    compiled = step.lower(state, setup["batch"]).compile()
    row["compile_s"] = time.perf_counter() - start
    counts: dict[str, int] = {}
    for op in _COLLECTIVE.findall(compiled.as_text()):
        counts[op] = counts.get(op, 0) + 1
    row["collectives"] = counts

    # `jit`: run through the jitted function, where JAX's profile-guided latency estimator
    # (JAX_ENABLE_PGLE=true) can profile the first calls and recompile; `aot`: the program above.
    run = step if args.dispatch == "jit" else compiled
    state, synced, queued = harness.time_train_step(
        run, state, setup["batch"], args.steps, args.warmup_steps
    )
    metrics = run(state, setup["batch"])[1]
    row.update(harness.step_rates(config.global_batch_size, synced, queued))
    row["images_per_s_per_device"] = row["images_per_s"] / (node * gpu)
    row["loss"] = float(metrics["loss"])
    return row


def run_children(
    cases: list[Case], args: argparse.Namespace, deadline: float, out: str, **kwargs
) -> tuple[dict[str, Any], list]:
    """`harness.run_children` of this module's worker."""
    return harness.run_children(
        "scripts.bench.step",
        [dataclasses.asdict(c) for c in cases],
        args,
        deadline,
        out,
        grace_s=args.grace_s,
        **kwargs,
    )


def add_scaling(rows: list[dict[str, Any]], baseline_rows: Sequence[dict[str, Any]]) -> None:
    """Adds `step_time_ratio` and `efficiency` against the same model's 1x1 row."""
    base = {r["model"]: r for r in baseline_rows if r["mesh"] == "1x1" and "step_time_s" in r}
    for r in rows:
        b = base.get(r["model"])
        if "step_time_s" in r and b and b["per_device_batch"] == r["per_device_batch"]:
            r["step_time_ratio"] = r["step_time_s"] / b["step_time_s"]
            r["efficiency"] = r["images_per_s"] / (r["devices"] * b["images_per_s"])
            if "synced_images_per_s" in r and "synced_images_per_s" in b:
                r["efficiency_synced"] = r["synced_images_per_s"] / (
                    r["devices"] * b["synced_images_per_s"]
                )


def variant_row(rows: Sequence[dict[str, Any]], model: str) -> dict[str, Any] | None:
    """The row an XLA-flag variant re-runs: the model's multi-device row with the most images/s,
    or, where only one device was measured (a one-GPU run), its fastest row."""
    done = [r for r in rows if r["model"] == model and "step_time_s" in r]
    multi = [r for r in done if r.get("devices", 1) > 1]
    return max(multi or done, key=lambda r: r["images_per_s"], default=None)


def format_row(r: dict[str, Any]) -> str:
    bucket = "" if r.get("bucket_mib") is None else f"{r['bucket_mib']:g}M"
    head = f"{r['model']:<11}{r.get('mesh_shape', r['mesh']):>6} {r['strategy']:<13}{bucket:>6}"
    if "step_time_s" not in r:
        return f"{head}  {r.get('error') or r.get('skipped')} {r.get('xla_flags', '')}"[:240]
    eff = "" if r.get("efficiency") is None else f"{r['efficiency']:.3f}"
    variant = (
        f"{r['speedup_vs_default']:.3f}x with {r['xla_flags']}" if "speedup_vs_default" in r else ""
    )
    return (
        f"{head}{r['compile_s']:>8.1f}{r['step_time_s'] * 1e3:>9.1f}{r['images_per_s']:>9.0f}"
        f"{r['images_per_s_per_device']:>9.0f}{eff:>7}  {variant}"
    )


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    header = (
        f"{'model':<11}{'mesh':>6} {'strategy':<13}{'bucket':>6}{'compile':>8}{'step_ms':>9}"
        f"{'img/s':>9}{'img/s/d':>9}{'eff':>7}  XLA-flag variant: speedup over default flags"
    )
    return "\n".join([header, *(format_row(r) for r in rows)])


def _add_case_args(parser: argparse.ArgumentParser) -> None:
    """Which cases: models, meshes, strategies, bucket sizes."""
    parser.add_argument("--models", type=harness.strings, default=["resnet50", "alexnet_bn"])
    parser.add_argument(
        "--meshes",
        type=harness.strings,
        default=list(MESHES),
        help=f"comma-separated subset of {','.join(MESHES)}",
    )
    parser.add_argument(
        "--strategies", type=harness.strings, default=["xla", "hierarchical", "flat", "hybrid"]
    )
    parser.add_argument(
        "--bucket_mib",
        type=harness.floats,
        default=[16.0],
        help="comm.bucket_bytes values (MiB) for the bucketing strategies",
    )


def _add_config_args(parser: argparse.ArgumentParser) -> None:
    """Overrides of the model's config: batch, image size, model, dtypes, crossover."""
    parser.add_argument(
        "--per_device_batch",
        type=int,
        default=None,
        help=f"images per device (default: 256, {trainer_step.PER_DEVICE_BATCH} by model)",
    )
    parser.add_argument("--image_size", type=int, default=224)
    parser.add_argument("--model_width", type=int, default=None, help="model.width override")
    parser.add_argument("--small_inputs", action="store_true", help="model.small_inputs=True")
    parser.add_argument(
        "--model_options", type=harness.strings, default=[], help="e.g. sliced_max_pool"
    )
    parser.add_argument("--compute_dtype", default="bfloat16")
    parser.add_argument("--comm_dtype", default=None, help="comm.dtype (default: the config's)")
    parser.add_argument(
        "--hybrid_crossover_mib",
        type=float,
        default=None,
        help="comm.hybrid_crossover_bytes in MiB (default: the config's)",
    )


def _add_timing_args(parser: argparse.ArgumentParser) -> None:
    """How each case is timed and how long the run and its children may take."""
    parser.add_argument("--steps", type=int, default=20, help="timed steps per case")
    parser.add_argument("--warmup_steps", type=int, default=3)
    parser.add_argument(
        "--dispatch",
        choices=("aot", "jit"),
        default="aot",
        help="time the ahead-of-time compiled step, or the jitted function (for "
        "JAX_ENABLE_PGLE=true JAX_PGLE_PROFILING_RUNS=n with --warmup_steps > n)",
    )
    parser.add_argument(
        "--budget_s",
        type=float,
        default=390,
        help="wall-clock budget of the whole run, variants included",
    )
    parser.add_argument(
        "--variant_budget_s",
        type=float,
        default=100,
        help="part of budget_s kept for the XLA-flag variants, if any",
    )
    parser.add_argument(
        "--grace_s",
        type=float,
        default=120,
        help="a child still running this long after its deadline is killed",
    )


def _add_run_args(parser: argparse.ArgumentParser) -> None:
    """XLA-flag variants, the quick preset, the output, and the hidden child-process spec."""
    parser.add_argument(
        "--xla_flags_variant",
        action="append",
        default=[],
        help="XLA flags to re-run each model's fastest case with; repeatable",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="meshes 1x1,1xn, strategies xla,hierarchical, 10 steps (~3 min on GPU)",
    )
    parser.add_argument("--out", default="bench_step.json")
    parser.add_argument("--worker_spec", help=argparse.SUPPRESS)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The arguments, `--quick` applied; exits on unknown meshes or strategies."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    _add_case_args(parser)
    _add_config_args(parser)
    _add_timing_args(parser)
    _add_run_args(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.meshes, args.strategies = ["1x1", "1xn"], ["xla", "hierarchical"]
        args.steps, args.warmup_steps = 10, 2
    for name, values, allowed in (
        ("meshes", args.meshes, MESHES),
        ("strategies", args.strategies, STRATEGIES),
    ):
        if set(values) - set(allowed):
            parser.error(
                f"--{name}: unknown {sorted(set(values) - set(allowed))}; choose from {allowed}"
            )
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any] | None:
    """Runs the benchmark; returns (and writes to `--out`) the JSON document."""
    args = parse_args(argv)
    if args.worker_spec:
        harness.worker(args.worker_spec, run_case, format_row)
        return None
    start = time.time()
    cases = build_cases(args.models, args.meshes, args.strategies, args.bucket_mib)
    reserve = args.variant_budget_s if args.xla_flags_variant else 0.0
    print(
        f"{len(cases)} cases, budget {args.budget_s:.0f} s ({reserve:.0f} s of it for "
        f"{len(args.xla_flags_variant)} XLA-flag variants)",
        flush=True,
    )

    environment, rows = run_children(
        cases, args, start + args.budget_s - reserve, f"{args.out}.default.json"
    )
    add_scaling(rows, rows)
    doc = {"environment": environment, "args": vars(args), "results": rows, "variants": []}
    # The longest default-flags case per model predicts the time of a variant's case.
    estimates = {}
    for r in rows:
        if "wall_s" in r:
            estimates[r["model"]] = max(estimates.get(r["model"], 0.0), r["wall_s"])
    for i, flags in enumerate(args.xla_flags_variant):
        for model in args.models:
            best = variant_row(rows, model)
            if best is None:
                print(f"variant {flags!r}: no measured {model} row to re-run", flush=True)
                continue
            case = Case(best["model"], best["mesh"], best["strategy"], best["bucket_mib"])
            _, variant = run_children(
                [case],
                args,
                start + args.budget_s,
                f"{args.out}.variant{i}.json",
                extra_flags=flags,
                estimates_s=estimates,
            )
            for r in variant:
                r["xla_flags"] = flags
                if "step_time_s" in r:
                    r["speedup_vs_default"] = best["step_time_s"] / r["step_time_s"]
            add_scaling(variant, rows)  # efficiency against the default-flags 1x1 row
            doc["variants"].extend(variant)
    doc["total_s"] = time.time() - start
    harness.write_json(args.out, doc)

    env = doc["environment"]
    print(
        f"\n{env.get('device_count')} x {env.get('device_kind')}, jax {env.get('jax_version')}, "
        f"git {env.get('git_rev', '')[:12]}; {doc['total_s']:.0f} s; eff = weak-scaling "
        "efficiency vs the 1x1 row; compile in s"
    )
    print(format_table(rows + doc["variants"]))
    return doc


if __name__ == "__main__":
    main()
