r"""Train-step time, images/s and weak-scaling efficiency of the trainer's own step program.

Each case builds the step exactly as `jia_jax.loop` does (`configs/resnet50_64k.py`, or
`configs/alexnet_bn_64k.py` for AlexNet-BN, with synthetic data and the overrides below), on a mesh
of 1x1 (one device: the weak-scaling baseline), 1xn or 2x(n/2) over the n devices, for each
`comm.strategy` and bucket size. The per-device batch is fixed, so the global batch grows with the
mesh, and

  weak-scaling efficiency = (images/s on n devices) / (n * images/s on 1 device)
                          = step time on 1 device / step time on n devices.

Timing: the init and the step are compiled, `--warmup_steps` steps run, then `--steps` steps
synced (each waited for before the next is dispatched) and `--steps` steps queued (one step in
flight ahead, as the training loop runs: step t+1 is dispatched before step t's metrics are
fetched; a sample is the time between two completions, and the queue never drains). The 2xH100
JSONs in docs/benchmarks/ were timed by an earlier version that drained the queue every 5 steps
(docs/benchmarks.md says what that costs). `step_time_s`, `images_per_s` and `efficiency` are the
queued medians (what training sees); `synced_*` are the synced ones.

Peers (`--strategies` may name them): `peer_ad_psum`, `peer_ad_psum_raveled` and
`peer_concat_buckets` (`scripts/peer_steps.py`) run the trainer's forward/backward and update with
the gradient mean written as others write it, in the same run, on 1xn meshes.
On one host a 2x(n/2) mesh reduces over the same devices as 1xn, so the strategies that do not
treat the node axis apart (`xla`, `flat`) run on 1xn only when both meshes are asked for.

Processes: XLA reads XLA_FLAGS once, at start-up, so the measurements run in child processes of
this script: one with the inherited flags for all cases, then, for each `--xla_flags_variant`,
one per model re-running that model's fastest multi-device case with those flags appended
(`speedup_vs_default` compares the two; a variant's `efficiency` is against the default 1x1
row). A child that dies loses only the case it was running: a new child goes on with the rest.
Cases run in a round-robin over the models, each model's 1x1 baseline first; once a case would end
past the budget it and the rest are recorded as skipped (`--budget_s` covers everything, of which
`--variant_budget_s` is kept for the variants). Each child rewrites its rows to
`<out>.default.json` / `<out>.variant<i>.json` after every case (merged into `--out` and removed
at the end), so even a killed run leaves its measurements.

Run from the repository root. On 4 GPUs the default list (14 cases) is estimated at about 6
minutes, mostly compiles (ResNet-50 30-60 s each, AlexNet-BN 10-20 s), `--quick` (6 cases) at
about 3; `--budget_s` bounds it whatever the compile times turn out to be:

  python -m scripts.bench_step --out=/tmp/bench_step.json \
      --xla_flags_variant=--xla_gpu_enable_latency_hiding_scheduler=true

On CPU with 8 simulated devices and a tiny model:

  XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu \
      python -m scripts.bench_step --models=resnet50 --model_width=8 --small_inputs \
      --image_size=32 --per_device_batch=2 --bucket_mib=0.01 --out=/tmp/bench_step.json
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import jax
import ml_collections

from configs import alexnet_bn_64k, resnet50_64k
from jia_jax import loop, train
from jia_jax import mesh as mesh_lib
from scripts import bench_allreduce, peer_steps

MIB = 1 << 20
STRATEGIES = ("xla", "flat", "hierarchical", "hybrid", "auto", *peer_steps.PEERS)
# Strategies that reduce over the node axis separately; the others see a 2-D mesh as 1-D.
NODE_AWARE = ("hierarchical", "hybrid")
MESHES = ("1x1", "1xn", "2xn/2")
PER_DEVICE_BATCH = {"alexnet_bn": 512}  # ResNets: 256 (what fits an 80 GB GPU in bf16 with room)
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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


def per_device_batch(model: str, override: int | None) -> int:
    return override or PER_DEVICE_BATCH.get(model, 256)


# ---------------------------------------------------------------------------------------------
# Worker: runs in a child process, the only one that touches the devices.


def make_config(
    case: Case, args: argparse.Namespace, node: int, gpu: int
) -> ml_collections.ConfigDict:
    """The trainer's config for `case`: the model's 64K config with the benchmark's overrides."""
    config = (alexnet_bn_64k if case.model == "alexnet_bn" else resnet50_64k).get_config()
    config.model.name = case.model
    if args.model_width:
        config.model.width = args.model_width
    if args.small_inputs:
        config.model.small_inputs = True
    config.data.name = "synthetic"
    config.data.image_size = args.image_size
    config.global_batch_size = per_device_batch(case.model, args.per_device_batch) * node * gpu
    config.eval_batch_size = config.global_batch_size
    config.mesh.node, config.mesh.gpu = node, gpu
    config.precision.compute = args.compute_dtype
    config.comm.strategy = case.strategy
    if case.bucket_mib is not None:
        config.comm.bucket_bytes = int(case.bucket_mib * MIB)
    if case.strategy == "auto":
        # The communication model chooses the buckets and the crossover too.
        config.comm.bucket_bytes = config.comm.hybrid_crossover_bytes = -1
    if args.comm_dtype:
        config.comm.dtype = args.comm_dtype
    if args.hybrid_crossover_mib is not None:
        config.comm.hybrid_crossover_bytes = int(args.hybrid_crossover_mib * MIB)
    return config


def build_setup(config: ml_collections.ConfigDict, devices: list[jax.Device]) -> dict[str, Any]:
    """What every strategy of one (model, mesh) shares: mesh, model, optimizer, init, batch.

    Built by `jia_jax.loop.build_trainer`, so the step is the trainer's program.
    """
    mesh = mesh_lib.create_mesh(
        config.mesh.node, config.mesh.gpu, devices=devices[: config.mesh.node * config.mesh.gpu]
    )
    trainer = loop.build_trainer(config, mesh)
    return {
        "mesh": mesh,
        "model": trainer.model,
        "tx": trainer.tx,
        "schedule": trainer.schedule,
        "init": trainer.init_state,
        "batch": next(trainer.data.train(0)),
    }


def run_case(
    case: Case,
    args: argparse.Namespace,
    setups: dict[tuple, dict[str, Any]],
    host_states: dict[str, Any],
    devices: list[jax.Device],
) -> dict[str, Any]:
    """Compiles and times one case; returns its result row (without the identifying fields).

    `setups` caches the (model, mesh) setup of the previous case, `host_states` each model's initial
    state on the host: it is the same on every mesh (same seed, replicated), so the init compiles
    once per model instead of once per mesh.
    """
    node, gpu = mesh_shape(case.mesh, len(devices))
    config = make_config(case, args, node, gpu)
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
        setups[key] = build_setup(config, devices)
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

    batch = setup["batch"]
    # `jit`: run through the jitted function, where JAX's profile-guided latency estimator
    # (JAX_ENABLE_PGLE=true) can profile the first calls and recompile; `aot`: the program above.
    run = step if args.dispatch == "jit" else compiled
    for _ in range(args.warmup_steps):
        state, metrics = run(state, batch)
    jax.block_until_ready(state)
    state, synced = time_steps(run, state, batch, args.steps, queued=False)
    state, queued = time_steps(run, state, batch, args.steps, queued=True)
    metrics = run(state, batch)[1]
    step_time = statistics.median(queued)
    row.update(
        {
            "step_time_s": step_time,
            "samples_s": queued,
            "images_per_s": config.global_batch_size / step_time,
            "images_per_s_per_device": config.global_batch_size / step_time / (node * gpu),
            "synced_step_time_s": statistics.median(synced),
            "synced_samples_s": synced,
            "synced_images_per_s": config.global_batch_size / statistics.median(synced),
            "loss": float(metrics["loss"]),
        }
    )
    return row


def time_steps(compiled, state, batch, steps: int, queued: bool) -> tuple[Any, list[float]]:
    """Seconds per step, one sample per step: synced or queued.

    Synced: each step is waited for before the next is dispatched (dispatch + device time).
    Queued: one step in flight ahead, as the training loop runs: step t+1 is dispatched, then
    step t's metrics are waited for; a sample is the time between two such completions, so the
    queue never drains and the device time between steps is what training sees.
    """
    samples, prev, last = [], None, None
    for _ in range(steps + 1 if queued else steps):
        start = time.perf_counter()
        state, metrics = compiled(state, batch)
        if not queued:
            jax.block_until_ready(metrics)
            samples.append(time.perf_counter() - start)
            continue
        if prev is not None:
            jax.block_until_ready(prev)
            now = time.perf_counter()
            if last is not None:
                samples.append(now - last)
            last = now
        prev = metrics
    jax.block_until_ready(state)
    return state, samples


def run_worker(spec_path: str) -> None:
    """Child process: runs the spec's cases before its deadline, rewriting its output each case."""
    with open(spec_path) as f:
        spec = json.load(f)
    args = argparse.Namespace(**spec["args"])
    devices = jax.devices()
    doc = {"environment": bench_allreduce.environment(), "results": []}
    setups: dict[tuple, dict[str, Any]] = {}
    host_states: dict[str, Any] = {}
    wall: dict[str, float] = dict(spec["estimates_s"])  # longest case so far, per model
    for fields in spec["cases"]:
        case = Case(**fields)
        row: dict[str, Any] = dataclasses.asdict(case)
        if time.time() + wall.get(case.model, 0.0) > spec["deadline"]:
            row["skipped"] = "budget_s"
        else:
            start = time.perf_counter()
            try:
                row.update(run_case(case, args, setups, host_states, devices))
            except Exception as e:  # pylint: disable=broad-except
                # One failing case (e.g. out of memory) must not lose the others.
                row["error"] = f"{type(e).__name__}: {e}"[:2000]
                setups.clear()
            row["wall_s"] = time.perf_counter() - start
            wall[case.model] = max(wall.get(case.model, 0.0), row["wall_s"])
        doc["results"].append(row)
        bench_allreduce.write_json(spec["out"], doc)
        print(f"[{len(doc['results'])}/{len(spec['cases'])}] {format_row(row)}", flush=True)


# ---------------------------------------------------------------------------------------------
# Parent: plans the cases, runs the children, derives the scaling figures, reports.


def run_children(
    cases: Sequence[Case],
    args: argparse.Namespace,
    deadline: float,
    out: str,
    extra_flags: str = "",
    estimates_s: dict[str, float] | None = None,
) -> tuple[dict[str, Any], list]:
    """Runs `cases` in child processes with `extra_flags` appended to XLA_FLAGS.

    A child that dies (e.g. a fatal CUDA error) is charged with the case it was running, and a new
    child takes the cases after it; one still running `--grace_s` after the deadline is killed and
    its unreached cases are marked. Nothing is raised.

    Returns:
      The first child's environment record and one result row per case, in order.
    """
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {extra_flags}".strip()
    environment: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    remaining = [dataclasses.asdict(c) for c in cases]
    while remaining:
        spec = {
            "args": vars(args),
            "cases": remaining,
            "deadline": deadline,
            "out": out,
            "estimates_s": estimates_s or {},
        }
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(spec, f)
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "scripts.bench_step", "--worker_spec", f.name],
                cwd=_REPO,
                env=env,
                timeout=max(1.0, deadline - time.time()) + args.grace_s,
                check=False,
            )
            failure = f"worker exited with status {proc.returncode}" if proc.returncode else None
        except subprocess.TimeoutExpired:
            failure = "worker killed: ran past budget_s + grace_s"
        finally:
            os.unlink(f.name)
        try:
            # The child's rows sit in `out` (next to --out) until here: they survive if we are killed.
            with open(out) as g:
                doc = json.load(g)
            os.remove(out)
        except (OSError, ValueError):
            doc = {"environment": {}, "results": []}
        environment = environment or doc["environment"]
        rows.extend(doc["results"])
        remaining = remaining[len(doc["results"]) :]
        if remaining:
            timed_out = failure is not None and failure.startswith("worker killed")
            lost = remaining if timed_out else remaining[:1]
            rows.extend({**fields, "error": failure or "worker ended early"} for fields in lost)
            remaining = remaining[len(lost) :]
    return environment, rows


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


def _strings(text: str) -> list[str]:
    return [v for v in text.split(",") if v]


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",") if v]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=_strings, default=["resnet50", "alexnet_bn"])
    parser.add_argument(
        "--meshes",
        type=_strings,
        default=list(MESHES),
        help=f"comma-separated subset of {','.join(MESHES)}",
    )
    parser.add_argument(
        "--strategies", type=_strings, default=["xla", "hierarchical", "flat", "hybrid"]
    )
    parser.add_argument(
        "--bucket_mib",
        type=_floats,
        default=[16.0],
        help="comm.bucket_bytes values (MiB) for the bucketing strategies",
    )
    parser.add_argument(
        "--per_device_batch",
        type=int,
        default=None,
        help=f"images per device (default: 256, {PER_DEVICE_BATCH} by model)",
    )
    parser.add_argument("--image_size", type=int, default=224)
    parser.add_argument("--model_width", type=int, default=None, help="model.width override")
    parser.add_argument("--small_inputs", action="store_true", help="model.small_inputs=True")
    parser.add_argument("--compute_dtype", default="bfloat16")
    parser.add_argument("--comm_dtype", default=None, help="comm.dtype (default: the config's)")
    parser.add_argument(
        "--hybrid_crossover_mib",
        type=float,
        default=None,
        help="comm.hybrid_crossover_bytes in MiB (default: the config's)",
    )
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
    args = parser.parse_args(argv)
    if args.quick:
        args.meshes, args.strategies, args.steps, args.warmup_steps = (
            ["1x1", "1xn"],
            ["xla", "hierarchical"],
            10,
            2,
        )
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
        run_worker(args.worker_spec)
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
                [case], args, start + args.budget_s, f"{args.out}.variant{i}.json", flags, estimates
            )
            for r in variant:
                r["xla_flags"] = flags
                if "step_time_s" in r:
                    r["speedup_vs_default"] = best["step_time_s"] / r["step_time_s"]
            add_scaling(variant, rows)  # efficiency against the default-flags 1x1 row
            doc["variants"].extend(variant)
    doc["total_s"] = time.time() - start
    bench_allreduce.write_json(args.out, doc)

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
