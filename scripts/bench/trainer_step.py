"""The trainer's own step, built for a benchmark: config overrides, mesh, state and one batch.

`step`, `peers` and `profile_step` time and trace exactly the program `jia_jax.loop` trains with:
the model's 64K config (`configs/resnet50_64k.py`, or `configs/alexnet_bn_64k.py` for AlexNet-BN)
on synthetic data, with the overrides a benchmark sets.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import ml_collections

from configs import alexnet_bn_64k, resnet50_64k
from jia_jax import loop
from jia_jax import mesh as mesh_lib

MIB = 1 << 20
# The `make_config` keywords that the benchmarks' flags of the same names set.
OVERRIDES = (
    "image_size",
    "model_width",
    "small_inputs",
    "compute_dtype",
    "comm_dtype",
    "hybrid_crossover_mib",
    "model_options",
)
PER_DEVICE_BATCH = {"alexnet_bn": 512}  # ResNets: 256 (what fits an 80 GB GPU in bf16 with room)


def per_device_batch(model: str, override: int | None) -> int:
    """Images per device: `override`, else the model's default."""
    return override or PER_DEVICE_BATCH.get(model, 256)


def make_config(
    model: str,
    strategy: str,
    node: int,
    gpu: int,
    *,
    bucket_mib: float | None = None,
    per_device_batch_override: int | None = None,
    image_size: int = 224,
    model_width: int | None = None,
    small_inputs: bool = False,
    compute_dtype: str = "bfloat16",
    comm_dtype: str | None = None,
    hybrid_crossover_mib: float | None = None,
    model_options: Sequence[str] = (),
) -> ml_collections.ConfigDict:
    """The model's 64K config on a `node` x `gpu` mesh with a benchmark's overrides (None: the
    config's own value)."""
    config = (alexnet_bn_64k if model == "alexnet_bn" else resnet50_64k).get_config()
    config.model.name = model
    if model_width:
        config.model.width = model_width
    if small_inputs:
        config.model.small_inputs = True
    for option in model_options:  # e.g. sliced_max_pool, or no_sliced_max_pool to turn it off
        name = option.removeprefix("no_")
        if name not in config.model:
            raise ValueError(f"--model_options: the config has no model.{name}")
        config.model[name] = name == option
    config.data.name = "synthetic"
    config.data.image_size = image_size
    config.global_batch_size = per_device_batch(model, per_device_batch_override) * node * gpu
    config.eval_batch_size = config.global_batch_size
    config.mesh.node, config.mesh.gpu = node, gpu
    config.precision.compute = compute_dtype
    config.comm.strategy = strategy
    if bucket_mib is not None:
        config.comm.bucket_bytes = int(bucket_mib * MIB)
    if strategy == "auto":
        # The communication model chooses the buckets and the crossover too.
        config.comm.bucket_bytes = config.comm.hybrid_crossover_bytes = -1
    if comm_dtype:
        config.comm.dtype = comm_dtype
    if hybrid_crossover_mib is not None:
        config.comm.hybrid_crossover_bytes = int(hybrid_crossover_mib * MIB)
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
