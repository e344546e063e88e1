"""Does packing the gradients into buckets change how XLA fuses ResNet-50's backward?

For each variant the trainer's step (ResNet-50, bf16, synthetic batch) is compiled on a 1xG mesh
of this process's GPUs; the row holds the kinds of fusion in its optimized HLO (how many
`loop_select` fusions write ReLU's masked gradient out, how many `input_reduce_select` fusions
fold it into BatchNorm's reductions) and its rate, 20 steps synced and 20 queued:

  * `xla`: `comm.strategy='xla'` (no buckets: XLA places the all-reduces);
  * `flat`: the trainer's default, as configured;
  * `flat_packed`: the buckets packed as backward produces them (`comm.pack_after_backward=
    'never'`), even on one device (`allreduce.reduce_buckets`, what the trainer ran before it
    returned one device's gradients untouched);
  * `flat_grad_barrier`: the same packed once backward has ended (`'always'`: one
    `optimization_barrier` over the whole gradient tree before packing);
  * `flat_leaves`: `flat_packed` with each bucket sent as its leaves, not concatenated
    (`comm.concatenate_buckets=False`);
  * `flat_vectors_apart`: `flat_packed` with the buckets holding only the kernels (leaves of
    two or more dimensions); the vectors (BatchNorm's scale and bias, the classifier's bias) are
    summed as leaves in one `psum`, never concatenated;
  * `flat_vectors_held`: `flat_packed` with the vectors passed through one
    `optimization_barrier` before packing (a probe: no bucket with a vector leaves before
    backward ends);
  * `flat_vectors_last`: `flat_packed` with the vectors in the last bucket, held until all
    exist (`comm.vectors_last`, what the trainer packs across hosts).

`flat_packed`, `flat_grad_barrier` and `flat_leaves` pack the vectors among the kernels.

  python -m scripts.bench.pack_fusion --gpus=1 --batches=256 --out=/tmp/pack_fusion.json
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import re
import time
from collections.abc import Sequence
from typing import Any
from unittest import mock

import jax
import jax.numpy as jnp

from jia_jax import allreduce, bucketing, train
from scripts.bench import harness, trainer_step

# Each variant's `comm` settings over the config's.
VARIANT_COMM: dict[str, dict[str, Any]] = {
    "xla": {"strategy": "xla"},
    "flat": {"strategy": "flat"},
    "flat_packed": {"strategy": "flat", "pack_after_backward": "never", "vectors_last": False},
    "flat_grad_barrier": {
        "strategy": "flat", "pack_after_backward": "always", "vectors_last": False
    },
    "flat_leaves": {
        "strategy": "flat", "pack_after_backward": "never", "concatenate_buckets": False,
        "vectors_last": False,
    },
    "flat_vectors_apart": {"strategy": "flat", "pack_after_backward": "never"},
    "flat_vectors_held": {"strategy": "flat", "pack_after_backward": "never"},
    "flat_vectors_last": {"strategy": "flat", "pack_after_backward": "never", "vectors_last": True},
}
VARIANTS = tuple(VARIANT_COMM)
# `%loop_select_fusion.3 = ...`: the fusion's kind, from the name XLA gives it.
_KIND = re.compile(r"%([a-z_]+?)_fusion(?:\.\d+)? = ")


def fusion_kinds(hlo: str) -> collections.Counter:
    """How many fusions of each kind the entry computation of an optimized HLO text runs."""
    return collections.Counter(k for line in harness.entry_lines(hlo) for k in _KIND.findall(line))


def _packed_everywhere(
    grads, *, bucket_bytes, wire_dtype, leaf_order=None, first_bucket_bytes=0,
    last_bucket_bytes=0, vectors_last=False, **reduction
):
    """`allreduce.reduce_gradients` without its one-device shortcut (`reduce_buckets`)."""
    plan = allreduce.plan_buckets(
        grads, bucket_bytes, wire_dtype, leaf_order, first_bucket_bytes, last_bucket_bytes,
        vectors_last,
    )
    return allreduce.reduce_buckets(grads, plan, **reduction)


def _backward_order(leaves: list, leaf_order: Sequence[int] | None) -> list[int]:
    return list(reversed(range(len(leaves))) if leaf_order is None else leaf_order)


def _vectors_apart(grads, *, bucket_bytes, wire_dtype, leaf_order=None, first_bucket_bytes=0,
                   last_bucket_bytes=0, vectors_last=False, **reduction):
    """`_packed_everywhere` of the kernels alone (`vectors_last` is moot); the vectors' mean is
    one `psum` of their leaves in the wire dtype."""
    del vectors_last
    leaves, treedef = jax.tree_util.tree_flatten(grads)
    order = _backward_order(leaves, leaf_order)
    vectors = bucketing.vector_leaves(order, [leaf.ndim for leaf in leaves])
    kernels = [i for i in order if i not in vectors]
    plan = allreduce.plan_buckets(
        [leaves[i] for i in kernels], bucket_bytes, wire_dtype, range(len(kernels)),
        first_bucket_bytes, last_bucket_bytes,
    )
    out = list(leaves)
    reduced = allreduce.reduce_buckets([leaves[i] for i in kernels], plan, **reduction)
    for i, leaf in zip(kernels, reduced):
        out[i] = leaf
    axes = (reduction.get("node_axis", "node"), reduction.get("gpu_axis", "gpu"))
    sums = jax.lax.psum(tuple(leaves[i].astype(wire_dtype) for i in vectors), axes)
    for i, total in zip(vectors, sums):
        out[i] = (total.astype(jnp.float32) / jax.lax.axis_size(axes)).astype(leaves[i].dtype)
    return treedef.unflatten(out)


def _vectors_held(grads, **kwargs):
    """`_packed_everywhere` (among the kernels) after one `optimization_barrier` over the vector
    leaves."""
    leaves = jax.tree_util.tree_leaves(grads)
    vectors = bucketing.vector_leaves(range(len(leaves)), [leaf.ndim for leaf in leaves])
    held = allreduce.hold_together(grads, vectors)
    return _packed_everywhere(held, **{**kwargs, "vectors_last": False})


_PATCHES = {"flat_vectors_apart": _vectors_apart, "flat_vectors_held": _vectors_held}


def _variant_patch(variant: str) -> contextlib.AbstractContextManager:
    """The patch a variant compiles under; every variant but `xla` and `flat` packs on any mesh
    (`allreduce.reduce_buckets`), so a barrier's effect shows on one GPU too."""
    if variant.startswith("flat_"):
        patch = _PATCHES.get(variant, _packed_everywhere)
        return mock.patch.object(allreduce, "reduce_gradients", patch)
    return contextlib.nullcontext()


def measure(
    variant: str, batch: int, gpus: int, tiny: bool, steps: int, hlo_dir: str | None = None
) -> dict[str, Any]:
    """One variant's row: fusion kinds of its compiled step and its synced and queued rates."""
    sizes = {"image_size": 32, "model_width": 8, "small_inputs": True} if tiny else {}
    comm = VARIANT_COMM[variant]
    config = trainer_step.make_config(
        "resnet50", comm["strategy"], 1, gpus, per_device_batch_override=batch, **sizes
    )
    config.comm.update(comm)
    setup = trainer_step.build_setup(config, jax.devices())
    state = setup["init"]()
    with _variant_patch(variant):
        step = train.make_train_step(
            setup["model"], setup["tx"], setup["schedule"], config, setup["mesh"]
        )
        start = time.perf_counter()
        compiled = step.lower(state, setup["batch"]).compile()
    row: dict[str, Any] = {"variant": variant, "gpus": gpus, "per_device_batch": batch}
    row["compile_s"] = time.perf_counter() - start
    hlo = compiled.as_text()
    if hlo_dir:
        os.makedirs(hlo_dir, exist_ok=True)
        with open(os.path.join(hlo_dir, f"{variant}_{gpus}x{batch}.txt"), "w") as f:
            f.write(hlo)
    kinds = fusion_kinds(hlo)
    row["fusions"] = sum(kinds.values())
    row["kinds"] = dict(kinds.most_common())
    state, synced, queued = harness.time_train_step(compiled, state, setup["batch"], steps, 3)
    row.update(harness.step_rates(config.global_batch_size, synced, queued))
    return row


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--batches", type=harness.strings, default=["256"])
    parser.add_argument("--variants", type=harness.strings, default=list(VARIANTS))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--hlo_dir", help="write each variant's optimized HLO text here")
    parser.add_argument("--tiny", action="store_true", help="a narrow model on 32x32 images (CPU)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    unknown = sorted(set(args.variants) - set(VARIANTS))
    if unknown:
        parser.error(f"--variants: unknown {unknown}; known: {', '.join(VARIANTS)}")
    doc = {"environment": harness.environment(), "args": vars(args), "results": []}
    for batch in map(int, args.batches):
        for variant in args.variants:
            try:
                row = measure(variant, batch, args.gpus, args.tiny, args.steps, args.hlo_dir)
            except Exception as e:  # the other variants still run
                row = {"variant": variant, "gpus": args.gpus, "per_device_batch": batch,
                       "error": harness.error_text(e)}
            print({k: v for k, v in row.items() if not k.endswith("samples_s")}, flush=True)
            doc["results"].append(row)
            harness.write_json(args.out, doc)
    return doc


if __name__ == "__main__":
    main()
