r"""One-device step rate of the trainer against the same model trained the plain way, one run.

Rows per model (`--models`), per-device batch (`--batches`) and compute dtype
(`--compute_dtype`), one after another on one GPU:

  * `trainer`: the trainer's step on a 1x1 mesh (`scripts/bench/trainer_step.py`: the model's
    64K config: LARS, fp32 master weights, metrics; in fp16, loss scaling);
  * `flax`: a plain flax step, `jax.jit(donate_argnums=0)` of forward/backward with the same
    model (`jia_jax.models`, fp32 parameters, the plain layers) and optax SGD with momentum;
  * `torch` (ResNet-50 only): torchvision's ResNet-50, channels-last, bf16 autocast, SGD with
    momentum, `torch.compile` of the model.

Trainer variants, on the models of `--variant_models` (default: all): each `--model_options`
(repeatable; comma-separated `model.*` options turned on, e.g. `sliced_max_pool`, or off with
`no_`, e.g. `no_space_to_depth_stem,no_sliced_max_pool`) at every batch, and each
`--xla_flags_variant` (repeatable; appended to XLA_FLAGS, e.g. command buffers) at
`--variant_batches` (default: all).
Their rows carry `model_options` / `xla_flags` and `speedup_vs_trainer`, their queued images/s
over the default trainer row's.

Processes: each torch row in a child of its own (JAX and PyTorch each take the GPU's memory); the
JAX rows with the same XLA flags in one child (XLA reads the flags once, at start-up), which
initialises each model's state once: the options keep the variables (tests/test_fused_layers.py).
Order: the flag variants, torch, the trainer and flax rows, then the option sets in the order
given: the one long child comes last, so a `--budget_s` cuts its last option sets (recorded as
skipped), not a whole child.

Synthetic ImageNet-shaped data resident on the device; 224 px unless `--image_size`; the JAX
rows compute in bf16 unless `--compute_dtype` says otherwise, and in each dtype it lists (e.g.
`bfloat16,float16`: the trainer's fp16 step scales its loss, the flax peer's does not); the
variants compute in the first. Timing as `scripts/bench/harness.py` times a
step: synced (each step waited for) and queued (one step in flight ahead, a sample per
completion; PyTorch waits on a CUDA event recorded after the previous step). Each trainer row
carries `ratio_vs_faster_peer`: its queued images/s over the faster peer's.

  python -m scripts.bench.peers --out=/tmp/bench_peers.json             # on one GPU

On CPU, tiny (the torch kind needs torch and torchvision):

  JAX_PLATFORMS=cpu python -m scripts.bench.peers --kinds=trainer,flax --batches=2 \
      --image_size=32 --model_width=8 --small_inputs --steps=4 --out=/tmp/bench_peers.json
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence
from typing import Any

from scripts.bench import harness

KINDS = ("trainer", "flax", "torch")
# The model options that compute the same function in fewer passes, off for the flax peer.
PLAIN_LAYERS = ("no_space_to_depth_stem", "no_sliced_max_pool")


def _jax_step(case: dict[str, Any], args: argparse.Namespace, cache: dict[str, Any]):
    """`(step, state, batch)` of the trainer or of the plain flax step.

    The initial state is made once per model, compute dtype and child (`cache`), kept on the
    host: every option set has the same variables, and each case donates its own copy.
    """
    import jax

    from jia_jax import mesh as mesh_lib
    from jia_jax import train
    from scripts.bench import trainer_step

    config = case_config(case, args)
    setup = trainer_step.build_setup(config, jax.devices()[:1])
    states = cache.setdefault("host_states", {})
    key = (case["model"], config.precision.compute)  # fp16's state holds a dynamic loss scale
    if key not in states:
        states[key] = jax.device_get(setup["init"]())
    state = jax.device_put(states[key], mesh_lib.replicated_sharding(setup["mesh"]))
    if case["kind"] == "trainer":
        step = train.make_train_step(
            setup["model"], setup["tx"], setup["schedule"], config, setup["mesh"]
        )
        return step, state, setup["batch"]
    flax_state, plain = _plain_flax_step(setup["model"], state)
    return plain, flax_state, setup["batch"]


def case_config(case: dict[str, Any], args: argparse.Namespace) -> Any:
    """The model's 64K config for a case on one device: the trainer's with the case's model
    options over the config's defaults; the plain flax step's with the plain layers, every
    option off, whatever the defaults: they are what the options are measured against."""
    from scripts.bench import trainer_step

    options = case.get("model_options", ()) if case["kind"] == "trainer" else PLAIN_LAYERS
    return trainer_step.make_config(
        case["model"],
        "xla",
        1,
        1,
        per_device_batch_override=case["per_device_batch"],
        image_size=args.image_size,
        model_width=args.model_width,
        small_inputs=args.small_inputs,
        compute_dtype=case.get("compute") or compute_dtypes(args)[0],  # a case made elsewhere
        model_options=options,
    )


def _plain_flax_step(model, trainer_state):
    """A plain flax train step from the trainer's initial parameters and statistics."""
    import jax
    import jax.numpy as jnp
    import optax

    tx = optax.sgd(0.1, momentum=0.9)
    params = trainer_state.params
    state = (params, trainer_state.batch_stats, tx.init(params), jnp.zeros((), jnp.int32))

    def step(state, batch):
        params, stats, opt_state, count = state

        def loss_fn(p):
            logits, new = model.apply(
                {"params": p, "batch_stats": stats},
                batch["image"],
                train=True,
                mutable=["batch_stats"],
                rngs={"dropout": jax.random.fold_in(jax.random.key(0), count)},
            )
            loss = optax.softmax_cross_entropy_with_integer_labels(
                logits.astype(jnp.float32), batch["label"]
            ).mean()
            return loss, new["batch_stats"]

        (loss, new_stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), new_stats, opt_state, count + 1), {
            "loss": loss
        }

    return state, jax.jit(step, donate_argnums=0)


def run_jax(case: dict[str, Any], args: argparse.Namespace, cache: dict[str, Any]) -> dict:
    """Compiles and times the trainer's or the plain flax step; the trainer's as it trains, with
    its convolutions in command buffers where `launch.convolution_graphs` says (primed: the
    first step runs compiled without them, `jia_jax.step_graphs`)."""
    from jia_jax import step_graphs

    step, state, data = _jax_step(case, args, cache)
    batch = case["per_device_batch"]
    mode = case_config(case, args).launch.convolution_graphs
    start = time.perf_counter()
    lowered = step.lower(state, data)
    if case["kind"] == "trainer":
        compiled, state, graphs = step_graphs.compile_like_training(lowered, mode, state, data)
    else:
        compiled, graphs = lowered.compile(), False
    compile_s = time.perf_counter() - start
    _, synced, queued = harness.time_train_step(
        compiled, state, data, args.steps, args.warmup_steps
    )
    row = {"compile_s": compile_s, **harness.step_rates(batch, synced, queued)}
    return {**row, "convolution_graphs": graphs} if case["kind"] == "trainer" else row


def run_torch(model_name: str, batch: int, args: argparse.Namespace) -> dict[str, Any]:
    """Compiles and times torchvision's ResNet-50 the way a PyTorch user trains it."""
    import torch
    import torch.nn.functional as F
    import torchvision

    if model_name != "resnet50":
        raise ValueError("the torch peer is ResNet-50 only (torchvision has no AlexNet-BN)")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = torchvision.models.resnet50().to(device, memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    compiled = torch.compile(model)
    images = torch.randn(batch, 3, args.image_size, args.image_size, device=device)
    images = images.to(memory_format=torch.channels_last)
    labels = torch.randint(0, 1000, (batch,), device=device)

    def step() -> torch.Tensor:
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = F.cross_entropy(compiled(images), labels, label_smoothing=0.1)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    def mark() -> Any:
        """An event after the work queued so far (None off the GPU, where steps run to the end)."""
        if device != "cuda":
            return None
        event = torch.cuda.Event()
        event.record()
        return event

    def wait(marker: Any) -> None:
        if marker is not None:
            marker.synchronize()

    start = time.perf_counter()
    step()
    wait(mark())
    compile_s = time.perf_counter() - start
    for _ in range(args.warmup_steps):
        step()
    wait(mark())
    synced = []
    for _ in range(args.steps):
        start = time.perf_counter()
        step()
        wait(mark())
        synced.append(time.perf_counter() - start)
    if device != "cuda":  # no queue to keep filled: each step already ran to its end
        return {"compile_s": compile_s, **harness.step_rates(batch, synced, synced)}
    queued, prev, last = [], None, None
    for _ in range(args.steps + 1):
        step()
        if prev is not None:
            wait(prev)
            now = time.perf_counter()
            if last is not None:
                queued.append(now - last)
            last = now
        prev = mark()
    wait(mark())
    return {"compile_s": compile_s, **harness.step_rates(batch, synced, queued)}


def measure(case: dict[str, Any], args: argparse.Namespace, cache: dict[str, Any]) -> dict:
    """Child process: times one kind of step for one model and batch."""
    if case["kind"] == "torch":
        return run_torch(case["model"], case["per_device_batch"], args)
    # The run's provenance comes from a JAX child: a torch child must not initialise JAX (it
    # would take the GPU's memory), nor must the parent.
    return {**run_jax(case, args, cache), "environment": harness.environment()}


def variant(r: dict[str, Any]) -> str:
    """A trainer row's options and flags ('' for the plain trainer and the peers)."""
    return " ".join(filter(None, ("+".join(r.get("model_options", ())), r.get("xla_flags", ""))))


def describe(r: dict[str, Any]) -> str:
    status = f"{r['images_per_s']:.0f} img/s" if "images_per_s" in r else r.get("error")
    case = f"{r['model']} {r['per_device_batch']} {r['kind']} {r['compute']}"
    return f"{case} {variant(r)}: {status}"


def compute_dtypes(args: argparse.Namespace) -> list[str]:
    """The `precision.compute` dtypes of `--compute_dtype`, in order."""
    return harness.strings(args.compute_dtype)


def build_cases(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The rows to measure, in the order of the module docstring."""
    kinds, models = harness.strings(args.kinds), harness.strings(args.models)
    batches = [int(b) for b in harness.strings(args.batches)]
    variant_models = harness.strings(args.variant_models) or models
    variant_batches = [int(b) for b in harness.strings(args.variant_batches)] or batches
    dtypes = compute_dtypes(args)

    def case(kind: str, model: str, batch: int, **fields: Any) -> dict[str, Any]:
        return {
            "kind": kind, "model": model, "per_device_batch": batch, "compute": dtypes[0], **fields
        }

    torch = [
        case("torch", "resnet50", b, compute="bfloat16")  # bf16 autocast, whatever the dtypes
        for b in batches if "torch" in kinds and "resnet50" in models
    ]
    plain = {"model_options": [], "xla_flags": ""}
    core = [
        case(k, m, b, compute=d, **(plain if k == "trainer" else {}))
        for m in models
        for b in batches
        for d in dtypes
        for k in kinds
        if k != "torch"
    ]
    options = [
        case("trainer", m, b, model_options=harness.strings(o), xla_flags="")
        for m in variant_models
        for o in args.model_options
        for b in batches
    ]
    flags = [
        case("trainer", m, b, model_options=[], xla_flags=f)
        for f in args.xla_flags_variant
        for m in variant_models
        for b in variant_batches
    ]
    return flags + torch + core + options


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """`ratio_vs_faster_peer` on each trainer row (queued images/s over the best peer's), and
    `speedup_vs_trainer` on each variant (over the plain trainer row's)."""
    for r in rows:
        if r["kind"] != "trainer" or "images_per_s" not in r:
            continue
        same = [p for p in rows if "images_per_s" in p and _same_case(p, r)]
        peers = [p["images_per_s"] for p in same if p["kind"] != "trainer"]
        if peers:
            r["ratio_vs_faster_peer"] = r["images_per_s"] / max(peers)
        plain = [p["images_per_s"] for p in same if p["kind"] == "trainer" and not variant(p)]
        if variant(r) and plain:
            r["speedup_vs_trainer"] = r["images_per_s"] / plain[0]


def _same_case(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Rows of one model, batch and compute dtype (bf16 in rows from before it was recorded)."""

    def key(r: dict[str, Any]) -> tuple:
        return r["model"], r["per_device_batch"], r.get("compute", "bfloat16")

    return key(a) == key(b)


def run_cases(cases: list[dict[str, Any]], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Runs consecutive JAX cases with the same XLA flags in one child, each torch case in its
    own, within `--budget_s`; the parent never touches a device."""
    deadline = time.time() + args.budget_s
    rows: list[dict[str, Any]] = []
    estimates: dict[str, float] = {}  # longest JAX case so far, per model
    groups: list[list[dict[str, Any]]] = []
    for c in cases:
        last = groups[-1][0] if groups else {"kind": "torch"}
        jax_pair = "torch" not in (c["kind"], last["kind"])
        if jax_pair and last.get("xla_flags", "") == c.get("xla_flags", ""):
            groups[-1].append(c)
        else:
            groups.append([c])
    for group in groups:
        _, done = harness.run_children(
            "scripts.bench.peers",
            group,
            args,
            deadline,
            f"{args.out}.child.json",
            grace_s=args.grace_s,
            extra_flags=group[0].get("xla_flags", ""),
            estimates_s=estimates,
        )
        for r in done:
            if r["kind"] != "torch" and "wall_s" in r:
                estimates[r["model"]] = max(estimates.get(r["model"], 0.0), r["wall_s"])
        rows.extend(done)
    return rows


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet50,alexnet_bn")
    parser.add_argument("--batches", default="256,64", help="per-device batches")
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--image_size", type=int, default=224)
    parser.add_argument("--model_width", type=int, default=None)
    parser.add_argument("--small_inputs", action="store_true")
    parser.add_argument(
        "--compute_dtype",
        default="bfloat16",
        help="precision.compute of the trainer and flax rows; comma-separated: rows in each "
        "(float32 compiles faster on CPU)",
    )
    parser.add_argument(
        "--model_options",
        action="append",
        default=[],
        help="repeatable: trainer rows with these model.* options on (off: no_sliced_max_pool,...)",
    )
    parser.add_argument(
        "--xla_flags_variant",
        action="append",
        default=[],
        help="repeatable: a trainer row with these XLA flags appended to XLA_FLAGS",
    )
    parser.add_argument("--variant_models", default="", help="models of the variants (default all)")
    parser.add_argument(
        "--variant_batches", default="", help="batches of the XLA-flag variants (default: all)"
    )
    parser.add_argument(
        "--budget_s",
        type=float,
        default=math.inf,
        help="wall-clock budget; a case that would end past it is recorded as skipped",
    )
    parser.add_argument(
        "--grace_s", type=float, default=60, help="a child running this long past it is killed"
    )
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup_steps", type=int, default=3)
    parser.add_argument("--out", default="bench_peers.json")
    parser.add_argument("--worker_spec", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Any] | None:
    """Runs the benchmark; returns (and writes to `--out`) the JSON document."""
    args = parse_args(argv)
    if not compute_dtypes(args):
        raise SystemExit("--compute_dtype: name a dtype or more, e.g. bfloat16 or bfloat16,float16")
    if args.worker_spec:
        harness.worker(args.worker_spec, measure, describe, provenance=None)
        return None
    rows = run_cases(build_cases(args), args)
    add_ratios(rows)
    environments = [r.pop("environment") for r in rows if "environment" in r]
    doc = {"environment": environments[0] if environments else {}, "args": vars(args)}
    doc["results"] = rows
    harness.write_json(args.out, doc)
    for r in rows:
        if "ratio_vs_faster_peer" in r:
            print(
                f"{r['model']} {r['per_device_batch']} {r['compute']}: trainer {variant(r)} / "
                f"faster peer = "
                f"{r['ratio_vs_faster_peer']:.3f}"
            )
    return doc


if __name__ == "__main__":
    main()
