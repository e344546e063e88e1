r"""What the GPU path's crop program costs the train step, apart or inside the step's program.

The GPU input path crops and resizes each batch's decoded tiles in a program of its own
(`crop_resize.crop_resize`), on XLA's stream between two train steps, so its kernels and the
gaps around its launch add to the step's time. On one GPU, the trainer's step one step in flight
ahead (`harness.time_train_step`), in rounds, each variant in turn:

  * `alone`: the step on the crop's images, already made (the synthetic-data step);
  * `apart`: the crop program, then the step on its images, two calls a step (the GPU path);
  * `fused`: one program, the crop's images fed straight into the step.

Tiles are random pixels in the generated JPEGs' size (scripts/bench/input.py) with train crop
windows, as `gpu_decode crop` times them. Each row: the variant's step rates; `fused` and
`apart` also their ms a step beyond `alone`'s.

  python -m scripts.bench.crop_in_step --per_gpu 256 64 --out=crop_in_step.json

On CPU (a tiny AlexNet-BN, XLA's products):

  JAX_PLATFORMS=cpu python -m scripts.bench.crop_in_step --tiny_model --train_model=alexnet_bn \
      --per_gpu 4 --crop_kernel=xla --steps=2 --rounds=1 --out=/tmp/crop_in_step.json
"""

from __future__ import annotations

import argparse
import functools
import json
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from jia_jax import crop_resize, crop_windows, train
from scripts.bench import harness, trainer_step
from scripts.bench import input as bench_input

VARIANTS = ("alone", "apart", "fused")


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
    """Each variant's `(run(state, inputs) -> (state, metrics), inputs)`: `batch` is the step's
    batch (its "image" unused) with the crop's "tiles", "example" and "params" added."""
    rest = {k: v for k, v in batch.items() if k not in ("image", "tiles", "example", "params")}

    def cropped(inputs: dict[str, Any]) -> dict[str, Any]:
        return {**rest, "image": crop(inputs["tiles"], inputs["example"], inputs["params"])}

    def apart(state: Any, inputs: dict[str, Any]) -> Any:
        return step(state, cropped(inputs))

    fused = jax.jit(apart, donate_argnums=0)
    return {
        "alone": (step, jax.block_until_ready(cropped(batch))),
        "apart": (apart, batch),
        "fused": (fused, batch),
    }


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
    states = {name: setup["init"]() for name in VARIANTS}
    samples: dict[str, tuple[list[float], list[float]]] = {n: ([], []) for n in VARIANTS}
    for round_ in range(args.rounds):
        for name in VARIANTS:
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
        for name in VARIANTS
    ]
    alone = rows[0]["step_time_s"]
    for row in rows[1:]:
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
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    doc: dict[str, Any] = {"args": vars(args), "results": []}
    for per_gpu in args.per_gpu:
        doc["results"] += measure(args, per_gpu)
        harness.write_json(args.out, doc)
    harness.close_record(args.out, doc)
    print(json.dumps([{k: v for k, v in r.items() if "samples" not in k}
                      for r in doc["results"]], indent=1))
    return doc


if __name__ == "__main__":
    main()
