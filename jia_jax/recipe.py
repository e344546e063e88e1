"""The recipe a checkpoint belongs to, and the check that a resumed run still follows it.

The training loop stores the run's config (as JSON) and device count in each checkpoint's meta.
On resume, `check_resume` compares them with the new run's and stops with the differences
(old -> new), unless the user opts in with ``allow_config_change``::

  current = of_run(config.to_json(), num_devices=mesh.devices.size)
  check_resume(meta, current, allow_change=config.allow_config_change, step=step, directory=d)
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Mapping
from typing import Any

from absl import logging

# Fields a resumed run may change without `allow_config_change`: they choose where the run
# executes and what it logs, evaluates or keeps, not the states it computes. Anything else that
# differs, a field the checkpoint's run did not have included, stops the run. In particular:
# - `total_steps` / `num_epochs` are compared: the learning-rate schedule (end of warmup, decay)
#   is a function of the total step count, so a longer run differs from its very first steps.
# - `mesh.*` may change: with the same device count, every mesh gives the k-th device the k-th
#   slice of each batch, hence the same BatchNorm batches and the same mean gradient (up to the
#   order of fp32 additions). The device count itself is compared (``num_devices``): it sets the
#   per-device BatchNorm batch.
# - `comm` strategy, buckets and crossover may change (`comm.first_bucket_bytes`,
#   `comm.last_bucket_bytes`, `comm.release_before_last`, `comm.start_when_ready`,
#   `comm.pack_after_backward`, `comm.concatenate_buckets`, `comm.vectors_last` and
#   `comm.tell_xla_network` may also be absent, in checkpoints from before they existed): every
#   strategy computes the same mean (up to summation order); so may `comm.network`, which only
#   picks the plan, and what XLA is told of it, which only moves the schedule. `comm.dtype`, the
#   precision on the wire, is compared.
# - `model.space_to_depth_stem` / `model.sliced_max_pool` may change (or be absent, in
#   checkpoints from before they existed): the same function on the same variables, another
#   summation order (tests/test_fused_layers.py).
FREE_ON_RESUME = (
    "allow_config_change",
    "log_every_steps",
    "eval_every_steps",
    "eval_batch_size",
    "checkpoint_every_steps",
    "checkpoint_keep",
    "profile.*",
    "data.data_dir",
    "data.num_workers",
    # Where and how the JPEGs are decoded changes only the pixels' arithmetic (the decoders and
    # resizes agree to a few levels of 255, tens with chroma samples repeated,
    # docs/input_pipeline.md): the same examples, windows and flips.
    "data.decode",
    "data.gpu_canvas",
    "data.gpu_fancy_upsampling",
    "data.gpu_decoder_options",
    "data.gpu_crop_kernel",
    "data.gpu_decode_depth",
    "data.gpu_tile_ring_depth",
    "distributed.*",
    # How the step's kernels are launched: the same step (jia_jax/step_graphs.py).
    "launch.*",
    "mesh.*",
    "comm.strategy",
    "comm.bucket_bytes",
    "comm.first_bucket_bytes",
    "comm.last_bucket_bytes",
    "comm.start_when_ready",
    "comm.hybrid_crossover_bytes",
    "comm.overlap",
    "comm.release_before_last",
    "comm.pack_after_backward",
    "comm.concatenate_buckets",
    "comm.vectors_last",
    "comm.network",
    "comm.tell_xla_network",
    "comm.told_bandwidth_scale",
    "model.space_to_depth_stem",
    "model.sliced_max_pool",
    # When to give up (on bad records, on overflowing fp16 steps): never what a step computes.
    "data.max_bad_records",
    "precision.loss_scale.max_skips_at_minimum",
)
# Fields that earlier versions had and today's no longer has, so a checkpoint that holds them
# resumes as if it did not. None changed the states a step computes beyond rounding:
# `comm.backward_cuts` (backward in parts) and `model.weight_grads_first` gave the same gradients
# bit for bit (tests of their time), and were measured slower and removed (docs/benchmarks.md,
# "Is the gradient all-reduce hidden under backward?"); `model.fused_bn` (a BatchNorm with a
# hand-written backward, on by default) computed the same function on the same variables up to
# rounding (one bf16 rounding fewer, another summation order), was measured no faster (ResNet-50
# on one H100: the step with it ran at 0.996 / 0.992 of the step without it at 256 / 64 images)
# and broke autodiff inside `jax.shard_map` with replicated params;
# `xla.command_buffer_convolutions` (off by default) only changed how the step's kernels were
# launched, and with it the trainer failed on an H200 (docs/benchmarks.md, "The same on one H200";
# `launch.convolution_graphs` does it primed, jia_jax/step_graphs.py);
# `comm.deferred_buckets` (the first buckets summed under the next step's forward, off by default)
# applied the same updates bit for bit, one program later, and was measured slower (docs/
# benchmarks.md, "Does summing the first buckets under the next step's forward hide them?");
# `comm.isolate_buckets` (a barrier over each bucket's gradients before packing, off by default)
# left the same values and XLA's fusion of backward as it was (docs/benchmarks.md, "One GPU");
# `model.input_moments` (BatchNorm statistics of ResNet's widening 1x1 convolutions from their
# input, off by default) gave the same statistics up to fp32 rounding and the same backward, and
# was measured no faster (docs/benchmarks.md, "Can BatchNorm's statistics come from a 1x1
# convolution's input?"); `model.pointwise_as_dot` (ResNet's 1x1 convolutions as matrix products,
# off by default) computed the same function on the same variables, and made XLA abort on a GPU
# (docs/benchmarks.md, "Can 1x1 convolutions as matrix products shorten the launch?").
RETIRED = (
    "comm.backward_cuts",
    "model.weight_grads_first",
    "model.fused_bn",
    "xla.command_buffer_convolutions",
    "comm.deferred_buckets",
    "comm.isolate_buckets",
    "model.input_moments",
    "model.pointwise_as_dot",
)
_MISSING = object()


class ConfigChangedError(ValueError):
    """The config differs from the one the checkpoint's run was trained with."""


def of_run(config_json: str, num_devices: int) -> dict[str, Any]:
    """A run's recipe as ``{dotted.name: value}``: its config (as JSON) and its device count."""
    return {**_flatten(json.loads(config_json)), "num_devices": num_devices}


def changes(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """``name: old -> new`` for each field of two recipes that differs, but `FREE_ON_RESUME` and
    `RETIRED`."""

    def show(recipe: Mapping[str, Any], name: str) -> str:
        return repr(recipe[name]) if name in recipe else "(absent)"

    return [
        f"{name}: {show(saved, name)} -> {show(current, name)}"
        for name in sorted(saved.keys() | current.keys())
        if saved.get(name, _MISSING) != current.get(name, _MISSING)
        and not any(fnmatch.fnmatchcase(name, free) for free in FREE_ON_RESUME)
        and name not in RETIRED
    ]


def check_resume(
    meta: Mapping[str, Any],
    current: Mapping[str, Any],
    *,
    allow_change: bool,
    step: int,
    directory: str,
) -> None:
    """Stops a resume whose recipe differs from the checkpoint's, unless `allow_change`.

    Args:
      meta: The restored checkpoint's meta (``config`` as JSON, ``num_devices``).
      current: `of_run` of the run that resumes.
      allow_change: Resume anyway (the differences are logged as a warning).
      step: The checkpoint's step, for the message.
      directory: The checkpoint directory, for the message.

    Raises:
      ConfigChangedError: The recipes differ and `allow_change` is False.
    """
    saved = _flatten(json.loads(meta.get("config", "{}")))
    if "num_devices" in meta:
        saved["num_devices"] = meta["num_devices"]
    listed = changes(saved, current)
    if not listed:
        return
    listing = "\n  " + "\n  ".join(listed)
    if allow_change:
        logging.warning(
            "Resuming the checkpoint of step %d with a changed config (allow_config_change):%s",
            step,
            listing,
        )
        return
    raise ConfigChangedError(
        f"The config differs from the one the checkpoint of step {step} in {directory} was "
        f"trained with (old -> new):{listing}\nTo resume that run, use its config (stored in "
        "the checkpoint's meta). To continue from it with these changes anyway, pass "
        "--config.allow_config_change=True. To start a new run, use a new --workdir."
    )


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
