"""Peer train steps for `scripts/bench/step.py`: the gradient mean written the ways others write it.

Each peer shares the trainer's forward/backward (`train.local_grads_fn`, microbatches included)
and its update (`train.update_fn`: unscale, optimizer, loss scale), and differs only in how the
per-device gradients become their mean over the mesh:

  * `peer_ad_psum`: `shard_map(check_vma=True)`; `jax.grad` of the replicated parameters returns
    gradients already summed over the devices (AD places one psum per leaf inside backward, the
    transpose of the implicit broadcast; XLA combines them), divided by the device count.
  * `peer_ad_psum_raveled`: the same, with the summed gradients raveled into one buffer before
    the division (the consumer that made XLA combine the psums into a few large ones).
  * `peer_concat_buckets`: after backward, leaves in reverse `tree_leaves` order, divided by the
    device count in fp32 and concatenated into buckets of at most `comm.bucket_bytes`, one `psum`
    each over both mesh axes, split back.
  * `peer_wire_buckets`: the same in the config's wire dtype (`comm.dtype`: the bytes the
    trainer sends), the plain step DDP-style trainers start from, without overlap.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import ml_collections
import optax
from jax.flatten_util import ravel_pytree
from jax.sharding import Mesh, PartitionSpec as P

from jia_jax import mesh as mesh_lib
from jia_jax import precision, train

PEERS = ("peer_ad_psum", "peer_ad_psum_raveled", "peer_concat_buckets", "peer_wire_buckets")


def _concat_buckets_mean(grads, bucket_bytes: int, devices: int, wire=jnp.float32):
    leaves, treedef = jax.tree.flatten(grads)
    groups, current, used = [], [], 0
    for i in reversed(range(len(leaves))):
        nbytes = leaves[i].size * jnp.dtype(wire).itemsize
        if current and used + nbytes > bucket_bytes:
            groups.append(current)
            current, used = [], 0
        current.append(i)
        used += nbytes
    groups.append(current)
    out = list(leaves)
    for group in groups:
        flat = jnp.concatenate(
            [(leaves[i].astype(jnp.float32).ravel() / devices).astype(wire) for i in group]
        )
        flat = jax.lax.psum(flat, mesh_lib.BATCH_AXES)
        offset = 0
        for i in group:
            out[i] = flat[offset : offset + leaves[i].size].reshape(leaves[i].shape)
            out[i] = out[i].astype(leaves[i].dtype)
            offset += leaves[i].size
    return treedef.unflatten(out)


def make_peer_step(
    kind: str,
    model,
    tx: optax.GradientTransformation,
    learning_rate: optax.Schedule,
    config: ml_collections.ConfigDict,
    mesh: Mesh,
) -> Callable:
    """The jitted `step(state, batch) -> (state, metrics)` of peer `kind` (one of `PEERS`)."""
    if kind not in PEERS:
        raise ValueError(f"unknown peer {kind!r}; expected one of {PEERS}")
    compute = precision.compute_dtype(config.precision.compute)
    devices = mesh.devices.size
    grads_fn = train.accumulate_microbatches(
        train.local_grads_fn(model, compute, config.loss.label_smoothing),
        config.microbatch_size,
        devices,
    )
    update = train.update_fn(tx, learning_rate, config)

    def per_device(params, batch_stats, scale, batch, key):
        low = train.cast_floats(params, compute)
        key = jax.random.fold_in(key, train.device_index(mesh))
        grads, stats, metrics = grads_fn(low, batch_stats, scale, batch, key)
        if kind == "peer_ad_psum":
            grads = jax.tree.map(lambda g: g / devices, grads)
        elif kind == "peer_ad_psum_raveled":
            flat, unravel = ravel_pytree(grads)
            grads = unravel(flat / devices)
        elif kind == "peer_concat_buckets":
            grads = _concat_buckets_mean(grads, config.comm.bucket_bytes, devices)
        else:
            grads = _concat_buckets_mean(grads, config.comm.bucket_bytes, devices, config.comm.dtype)
        stats, metrics = jax.lax.pmean((stats, metrics), mesh_lib.BATCH_AXES)
        return grads, stats, metrics

    sharded = jax.shard_map(
        per_device,
        mesh=mesh,
        in_specs=(P(), P(), P(), P(mesh_lib.BATCH_AXES), P()),
        out_specs=(P(), P(), P()),
        check_vma=kind.startswith("peer_ad"),
    )

    def step(state, batch):
        key = jax.random.fold_in(jax.random.PRNGKey(config.seed), state.step)
        grads, stats, metrics = sharded(
            state.params, state.batch_stats, state.loss_scale.scale, batch, key
        )
        return update(state, grads, stats, metrics)

    return jax.jit(step, donate_argnums=0)
