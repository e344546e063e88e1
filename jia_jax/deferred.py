"""Gradient buckets reduced while the next step's forward runs (`comm.deferred_buckets`).

Backward produces the last layers' gradients first, so the first buckets it fills hold the
parameters that the next forward reads last. Across a slow network, their all-reduce need not
finish inside this step's backward: it can run under the next step's forward, until the layers
that read those parameters are reached. With `comm.deferred_buckets = k`, a step sums only the
buckets after the first k during its backward and hands the first k on unreduced, per device; the
next step starts by summing them, and the optimizer update of the step before runs there, on the
full mean gradient. XLA starts that all-reduce at the top of the program (its operands are
inputs) and has to wait for it only where forward reaches the last layers, so the wire time of
the first buckets moves off backward, where the other buckets queue for the same link.

The update a step applies is the same as without deferral: the same buckets, summed by the same
collectives in the same wire dtype, then the same optimizer on the full mean (bit for bit in
`tests/test_deferred.py`); it is applied later, at the top of the next step's program, so a
state at a step boundary holds one update still to apply (`Carry.pending`). `settle` applies it:
the loop does so before every checkpoint and evaluation, so checkpoints never hold a carry.
fp16 is excluded: its loss scaling decides from all gradients whether any update applies.
"""

from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp
import ml_collections
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jia_jax import allreduce, precision
from jia_jax import mesh as mesh_lib


class Carry(flax.struct.PyTreeNode):
    """A step's gradients still to apply, handed to the next step.

    Attributes:
      pending: bool scalar: the buckets hold gradients that no update has applied yet.
      local: the first buckets, unreduced, each `(devices, size)`, one row per device.
      reduced: the other buckets, summed over the devices, each `(size,)`, replicated.
      plan: the packing of the gradient tree into the buckets (static).
      strategy: the collective of `comm.strategy` (static).
      hybrid_crossover_bytes: `hybrid`'s crossover (static).
    """

    pending: jax.Array
    local: list[jax.Array]
    reduced: list[jax.Array]
    plan: allreduce.BucketPlan = flax.struct.field(pytree_node=False)
    strategy: str = flax.struct.field(pytree_node=False)
    hybrid_crossover_bytes: int = flax.struct.field(pytree_node=False)


def check_config(config: ml_collections.ConfigDict) -> int:
    """`comm.deferred_buckets`, checked against the strategy and precision it needs.

    Raises:
      ValueError: naming the field and what to change.
    """
    count = config.comm.deferred_buckets
    if not isinstance(count, int) or count < 0:
        raise ValueError(f"comm.deferred_buckets={count!r} must be a whole number >= 0.")
    if count and config.comm.strategy == "xla":
        raise ValueError(
            f"comm.deferred_buckets={count} needs buckets of the trainer's own: set comm.strategy "
            "to flat, hierarchical, hybrid or auto, or comm.deferred_buckets=0."
        )
    compute = precision.compute_dtype(config.precision.compute)
    if count and precision.needs_loss_scaling(compute):
        raise ValueError(
            f"comm.deferred_buckets={count} with precision.compute={config.precision.compute}: "
            "loss scaling decides from all gradients whether a step applies, so no part of the "
            "update could start before the deferred buckets arrive. Use bfloat16, or set "
            "comm.deferred_buckets=0."
        )
    return count


def split_reduce(
    grads: Any,
    plan: allreduce.BucketPlan,
    count: int,
    comm: ml_collections.ConfigDict,
    node_axis: str = mesh_lib.NODE_AXIS,
    gpu_axis: str = mesh_lib.GPU_AXIS,
) -> tuple[list[jax.Array], list[jax.Array]]:
    """Per device (inside `shard_map`): `grads` packed as `plan`; the first `count` buckets
    unreduced (a leading axis of 1, for a per-device output), the others summed over the mesh.

    The buckets are `allreduce.reduce_gradients`' own: `Carry`'s mean equals its mean.
    """
    devices = jax.lax.axis_size((node_axis, gpu_axis))
    buckets = allreduce.pack_for_mean(grads, plan, devices)
    reduced = [
        allreduce.sum_bucket(b, comm.strategy, comm.hybrid_crossover_bytes, node_axis, gpu_axis)
        for b in buckets[count:]
    ]
    if comm.overlap and reduced:
        reduced = allreduce.hold_until_all_reduced(reduced)
    return [b[None] for b in buckets[:count]], reduced


def empty(
    plan: allreduce.BucketPlan, count: int, comm: ml_collections.ConfigDict, mesh: Mesh
) -> Carry:
    """A carry with nothing pending, laid out as the step's own (so the step compiles once)."""
    sizes = plan.bucket_sizes()
    count = min(count, len(sizes))
    devices = mesh.devices.size
    local = [jax.ShapeDtypeStruct((devices, n), plan.wire_dtype) for n in sizes[:count]]
    reduced = [jax.ShapeDtypeStruct((n,), plan.wire_dtype) for n in sizes[count:]]
    shardings = (
        mesh_lib.replicated_sharding(mesh),
        [mesh_lib.batch_sharding(mesh)] * len(local),
        [mesh_lib.replicated_sharding(mesh)] * len(reduced),
    )
    zeros = jax.jit(
        lambda: (
            jnp.zeros((), bool),
            [jnp.zeros(s.shape, s.dtype) for s in local],
            [jnp.zeros(s.shape, s.dtype) for s in reduced],
        ),
        out_shardings=shardings,
    )
    pending, local_zeros, reduced_zeros = zeros()
    return Carry(
        pending, local_zeros, reduced_zeros, plan, comm.strategy, comm.hybrid_crossover_bytes
    )


def pinned(carry: Carry, mesh: Mesh, pending: bool) -> Carry:
    """`carry` with `pending` set, constrained to `empty`'s shardings (inside jit): a step's output
    carry is laid out as its input, so the next call reuses the compiled step."""
    rows = NamedSharding(mesh, P(mesh_lib.BATCH_AXES))
    whole = mesh_lib.replicated_sharding(mesh)
    constrain = jax.lax.with_sharding_constraint
    return carry.replace(
        pending=constrain(jnp.array(pending), whole),
        local=[constrain(x, rows) for x in carry.local],
        reduced=[constrain(x, whole) for x in carry.reduced],
    )


def mean(carry: Carry, mesh: Mesh) -> Any:
    """The mean gradient tree of a carry (inside jit): the first buckets summed over the mesh,
    then every bucket unpacked as `allreduce.reduce_gradients` unpacks it."""

    def per_device(local):
        return [
            allreduce.sum_bucket(
                x[0], carry.strategy, carry.hybrid_crossover_bytes,
                mesh_lib.NODE_AXIS, mesh_lib.GPU_AXIS,
            )
            for x in local
        ]

    summed = jax.shard_map(
        per_device,
        mesh=mesh,
        in_specs=(P(mesh_lib.BATCH_AXES),),
        out_specs=P(),
        check_vma=False,
    )(carry.local)
    return allreduce.unpack_mean([*summed, *carry.reduced], carry.plan, mesh.devices.size)
