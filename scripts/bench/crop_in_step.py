r"""What the GPU path's crop program costs the train step, apart or inside the step's program.

The GPU input path crops and resizes each batch's decoded tiles in a program of its own
(`crop_resize.crop_resize`), on XLA's stream between two train steps, so its kernels and the
gaps around its launch add to the step's time. On one GPU, the trainer's step one step in flight
ahead (`harness.time_train_step`), in rounds, each variant in turn:

  * `alone`: the step on the crop's images, already made (the synthetic-data step);
  * `apart`: the crop program, then the step on its images, two calls a step (the GPU path);
  * `fused`: one program, the crop's images fed straight into the step;
  * `streamed`: one program, the step on the images the call before cropped, beside the crop of
    the next batch on XLA's stream 1 (`compute_on("gpu_stream:1")`; XLA runs it there only with
    `--xla_gpu_experimental_stream_annotation=true` in XLA_FLAGS): can the crop's kernels run
    while the step's do?
  * `grouped`: `streamed` with the crop and the step in one scheduling group
    (`set_xla_metadata(_scheduling_group_id=...)`), which asks XLA's latency-hiding scheduler
    (`--xla_gpu_enable_latency_hiding_scheduler=true`) to run the group's work between the
    crop's start and its end.

`--trace_dir` traces `--trace_steps` more steps of each variant after its rounds and records,
per stream, its kernels and their busy µs a step, and how much of the other streams' busy time
XLA's stream was busy too (did the crop run beside the step?).
`--hlo_dump` reads the optimized HLO that XLA dumped (`--xla_dump_to`) of `streamed` and
`grouped` and records each async call on an annotated stream, how much the schedule puts
between its start and its end and on which execution thread it is, and how many of the
program's instructions kept a scheduling group.
`--later_mode` first launches 10 empty kernels on a second CUDA stream, as the GPU path's decoders
put the step in the later mode of docs/benchmarks.md (its kernels follow one another later).

Tiles are random pixels in the generated JPEGs' size (scripts/bench/input.py) with train crop
windows, as `gpu_decode crop` times them. Each row: the variant's step rates; `fused` and
`apart` also their ms a step beyond `alone`'s.

  python -m scripts.bench.crop_in_step --per_gpu 256 64 --out=crop_in_step.json
  XLA_FLAGS=--xla_gpu_experimental_stream_annotation=true python -m scripts.bench.crop_in_step \
      --variants alone apart streamed --later_mode --out=crop_streamed.json

On CPU (a tiny AlexNet-BN, XLA's products):

  JAX_PLATFORMS=cpu python -m scripts.bench.crop_in_step --tiny_model --train_model=alexnet_bn \
      --per_gpu 4 --crop_kernel=xla --steps=2 --rounds=1 --out=/tmp/crop_in_step.json
"""

from __future__ import annotations

import argparse
import functools
import glob
import json
import os
import re
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.experimental import compute_on
from jax.experimental.xla_metadata import set_xla_metadata

from jia_jax import crop_resize, crop_windows, train
from scripts.bench import harness, profile_trace, trainer_step
from scripts.bench import input as bench_input

VARIANTS = ("alone", "apart", "fused", "streamed", "grouped")
_CARRIES_IMAGES = ("streamed", "grouped")
# The XLA stream `streamed` crops on; XLA's own compute stream is 0.
_CROP_STREAM = "gpu_stream:1"
# compute_on's function form: jax 0.10 names it compute_on2, 0.11 compute_on.
_ON = getattr(compute_on, "compute_on2", compute_on.compute_on)


def crop_inputs(per_gpu: int, image_size: int, canvas: int, seed: int = 0) -> dict[str, Any]:
    """Host arrays of one batch's crop: random tiles of the generated JPEGs' size, their plan
    (train windows, padded as the GPU path pads it) and whether it is one tile an example."""
    rng = np.random.default_rng(seed)
    width, height = bench_input.WIDTH, bench_input.HEIGHT
    windows = [crop_windows.train_window(rng, width, height) for _ in range(per_gpu)]
    plan = crop_resize.plan_tiles(
        np.array([w for w, _ in windows], np.float64),
        np.tile([width, height], (per_gpu, 1)),
        np.array([f for _, f in windows]),
        np.ones(per_gpu, bool),
        image_size,
        canvas,
    )
    plan = crop_resize.pad_plan(
        plan, crop_resize.padded_count(len(plan.example), per_gpu), per_gpu
    )
    tiles = rng.integers(0, 256, (len(plan.example), canvas, canvas, 3), np.uint8)
    return {
        "tiles": tiles,
        "example": plan.example,
        "params": plan.params,
        "one_tile_each": crop_resize.is_one_tile_each(plan, per_gpu),
    }


def variants(
    step: Callable[..., Any], crop: Callable[..., jax.Array], batch: dict[str, Any]
) -> dict[str, tuple[Callable[..., Any], dict[str, Any]]]:
    """Each variant's `(run(carry, inputs) -> (carry, metrics), inputs)`: `batch` is the step's
    batch (its "image" unused) with the crop's "tiles", "example" and "params" added. The carry
    is the train state, or for `streamed` the state and the images its next step trains on
    (`first_carry`)."""
    rest = {k: v for k, v in batch.items() if k not in ("image", "tiles", "example", "params")}

    def cropped(inputs: dict[str, Any]) -> dict[str, Any]:
        return {**rest, "image": crop(inputs["tiles"], inputs["example"], inputs["params"])}

    def apart(state: Any, inputs: dict[str, Any]) -> Any:
        return step(state, cropped(inputs))

    def flat_crop(inputs: dict[str, Any]) -> jax.Array:
        # Nested jits (the crop's own, jax.numpy's) would become calls that inherit the stream
        # annotation inside the annotated one, which XLA refuses ("No ExecutionStreamId found").
        with jax.disable_jit():
            return cropped(inputs)["image"]

    crop_on_stream = _ON(
        flat_crop, compute_type=_CROP_STREAM, out_memory_spaces=jax.memory.Space.Device
    )

    def streamed(carry: tuple[Any, jax.Array], inputs: dict[str, Any]) -> Any:
        state, images = carry
        upcoming = crop_on_stream(inputs)
        state, metrics = step(state, {**rest, "image": images})
        return (state, upcoming), metrics

    def grouped(carry: tuple[Any, jax.Array], inputs: dict[str, Any]) -> Any:
        with set_xla_metadata(_scheduling_group_id=1):
            return streamed(carry, inputs)

    return {
        "alone": (step, jax.block_until_ready(cropped(batch))),
        "apart": (apart, batch),
        "fused": (jax.jit(apart, donate_argnums=0), batch),
        "streamed": (jax.jit(streamed, donate_argnums=0), batch),
        "grouped": (jax.jit(grouped, donate_argnums=0), batch),
    }


def first_carry(name: str, state: Any, runs: dict[str, Any]) -> Any:
    """The carry `name`'s run starts from: `streamed` trains on the images cropped a call
    before, so its first call gets a copy of those the crop makes (`alone`'s: the carry is
    donated)."""
    if name not in _CARRIES_IMAGES:
        return state
    return state, jax.numpy.array(runs["alone"][1]["image"], copy=True)


def later_mode(device: jax.Device) -> None:
    """Ten empty kernels on a second CUDA stream of `device`'s GPU: from then on the step's
    kernels follow one another as they do beside the GPU path's decoders."""
    from scripts.bench import second_stream  # pylint: disable=import-outside-toplevel

    ordinal = getattr(device, "local_hardware_id", None) or 0
    second_stream.EmptyKernels(ordinal).launch(10)


def concurrent_length(kernels: Sequence[profile_trace.Kernel]) -> float:
    """How long two or more of `kernels` ran at once, whatever their streams (the kernels of a
    CUDA graph are traced on the stream that launched it, even where they ran side by side)."""
    edges = sorted([(k.start_us, 1) for k in kernels] + [(k.end_us, -1) for k in kernels])
    total, running, since = 0.0, 0, 0.0
    for time, change in edges:
        if running >= 2:
            total += time - since
        running, since = running + change, time
    return total


def stream_overlap(kernels: Sequence[profile_trace.Kernel], steps: int) -> dict[str, Any]:
    """Per stream, its kernels and busy µs a step; the µs a step two or more kernels ran at
    once; and of the other streams' busy time, the µs a step the busiest stream (XLA's) was busy
    too."""
    main = profile_trace.busiest_stream(kernels)
    busy = {
        stream: profile_trace.union((k.start_us, k.end_us) for k in kernels if k.stream == stream)
        for stream in {k.stream for k in kernels}
    }
    others = profile_trace.union(span for s, spans in busy.items() if s != main for span in spans)
    return {
        "streams": {
            s: {"kernels": sum(k.stream == s for k in kernels) / steps,
                "busy_us": profile_trace.length(spans) / steps, "main": s == main}
            for s, spans in busy.items()
        },
        "concurrent_us": concurrent_length(kernels) / steps,
        "others_busy_us": profile_trace.length(others) / steps,
        "others_beside_main_us": profile_trace.length(
            profile_trace.intersection(others, busy[main])) / steps,
    }


def _entry(hlo: str) -> list[str]:
    """The instruction lines of the ENTRY computation of optimized HLO text, in order."""
    return hlo[hlo.index("\nENTRY"):].split("\n}", 1)[0].splitlines()[1:]


def stream_calls(hlo: str) -> list[dict[str, Any]]:
    """Each async call on an annotated stream in the ENTRY computation of optimized HLO text (in
    its scheduled order): its name, how many instructions, parameters aside, the schedule puts
    between its start and its done (work XLA's own stream can do while it runs), the execution
    thread of its computation (XLA's latency-hiding scheduler gives an async call the latency
    that work could hide only on a thread other than the ENTRY's, `main`) and its scheduling
    group, if any."""
    ops = [(m.group(1), m.group(2), line) for line in _entry(hlo)
           if (m := re.match(r"\s*(?:ROOT )?%(\S+) = .*? ([a-z][\w-]*)\(", line))]
    calls = []
    for i, (name, opcode, line) in enumerate(ops):
        if opcode != "async-start" or "_xla_stream_annotation" not in line:
            continue
        done = next(j for j in range(i + 1, len(ops))
                    if ops[j][1] == "async-done" and f"(%{name})" in ops[j][2])
        between = sum(op != "parameter" for _, op, _ in ops[i + 1:done])
        thread = re.search(r'async_execution_thread="([^"]+)"', line)
        group = re.search(r'_scheduling_group_id="([^"]+)"', line)
        calls.append({"start": name, "instructions_between": between,
                      "execution_thread": thread.group(1) if thread else "main",
                      "scheduling_group": group.group(1) if group else None})
    return calls


def grouped_instructions(hlo: str) -> int:
    """How many instructions of the ENTRY computation of optimized HLO text carry a scheduling
    group (`_scheduling_group_id`), the ones the latency-hiding scheduler keeps together."""
    return sum("_scheduling_group_id" in line for line in _entry(hlo))


def traced(run: Callable[..., Any], carry: Any, given: Any, steps: int, path: str) -> Any:
    """`steps` steps of `run` traced into `path`, one in flight ahead: (carry, overlap), the
    overlap None where the trace has no GPU's kernels (on CPU)."""
    jax.block_until_ready(carry)
    with jax.profiler.trace(path):
        for _ in range(steps):
            carry, metrics = run(carry, given)
        jax.block_until_ready((carry, metrics))
    kernels = list(profile_trace.load_kernels(path).values())
    return carry, stream_overlap(kernels[0], steps) if kernels else None


def measure(args: argparse.Namespace, per_gpu: int) -> list[dict[str, Any]]:
    """The rows of one per-GPU batch: every variant timed `--rounds` times, in turn."""
    device = jax.local_devices()[0]
    small = dict(image_size=32, model_width=8, small_inputs=True) if args.tiny_model else {}
    config = trainer_step.make_config(
        args.train_model, "flat", 1, 1, per_device_batch_override=per_gpu, **small
    )
    setup = trainer_step.build_setup(config, [device])
    step = train.make_train_step(
        setup["model"], setup["tx"], setup["schedule"], config, setup["mesh"]
    )
    inputs = crop_inputs(per_gpu, config.data.image_size, args.canvas)
    crop = functools.partial(
        crop_resize.crop_resize, batch=per_gpu, image_size=config.data.image_size,
        one_tile_each=inputs.pop("one_tile_each"), kernel=args.crop_kernel,
    )
    batch = {**setup["batch"], **jax.device_put(inputs, device)}
    runs = variants(step, crop, batch)
    states = {name: first_carry(name, setup["init"](), runs) for name in args.variants}
    samples: dict[str, tuple[list[float], list[float]]] = {n: ([], []) for n in args.variants}
    for round_ in range(args.rounds):
        for name in args.variants:
            run, given = runs[name]
            warmup = args.warmup_steps if round_ == 0 else 0
            states[name], synced, queued = harness.time_train_step(
                run, states[name], given, args.steps, warmup
            )
            samples[name][0].extend(synced)
            samples[name][1].extend(queued)
    rows = [
        {"per_gpu": per_gpu, "variant": name, "crop_kernel": args.crop_kernel,
         "tiles": len(inputs["example"]), **harness.step_rates(per_gpu, *samples[name])}
        for name in args.variants
    ]
    for name in set(args.variants) & set(_CARRIES_IMAGES) if args.hlo_dump else []:
        path = max(glob.glob(f"{args.hlo_dump}/*.jit_{name}.*after_optimizations.txt"),
                   key=os.path.getmtime)
        with open(path) as f:
            hlo = f.read()
        rows[args.variants.index(name)].update(
            stream_calls=stream_calls(hlo), grouped_instructions=grouped_instructions(hlo))
    for row in rows if args.trace_dir else []:
        name = row["variant"]
        run, given = runs[name]
        states[name], row["trace"] = traced(
            run, states[name], given, args.trace_steps, f"{args.trace_dir}/{per_gpu}_{name}")
    if "alone" in args.variants:
        alone = rows[args.variants.index("alone")]["step_time_s"]
        for row in rows:
            if row["variant"] != "alone":
                row["ms_beyond_alone"] = (row["step_time_s"] - alone) * 1e3
    return rows


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per_gpu", type=int, nargs="+", default=[256, 64])
    parser.add_argument("--canvas", type=int, default=512, help="data.gpu_canvas")
    parser.add_argument("--crop_kernel", default=crop_resize.DEFAULT_KERNEL,
                        choices=crop_resize.KERNELS)
    parser.add_argument("--steps", type=int, default=20, help="steps timed a round, each way")
    parser.add_argument("--warmup_steps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--train_model", default="resnet50")
    parser.add_argument("--tiny_model", action="store_true", help="a tiny model (CPU tests)")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS[:3]), choices=VARIANTS)
    parser.add_argument("--trace_dir", help="trace each variant's steps here (see above)")
    parser.add_argument("--hlo_dump", help="the folder XLA_FLAGS' --xla_dump_to names: record "
                        "where the optimized HLO of `streamed` and `grouped` schedules its crop")
    parser.add_argument("--trace_steps", type=int, default=5)
    parser.add_argument("--later_mode", action="store_true",
                        help="10 empty kernels on a second CUDA stream first (needs a GPU)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    doc: dict[str, Any] = {"args": vars(args), "results": []}
    if args.later_mode:
        later_mode(jax.local_devices()[0])
    for per_gpu in args.per_gpu:
        doc["results"] += measure(args, per_gpu)
        harness.write_json(args.out, doc)
    harness.close_record(args.out, doc)
    print(json.dumps([{k: v for k, v in r.items() if "samples" not in k}
                      for r in doc["results"]], indent=1))
    return doc


if __name__ == "__main__":
    main()
