"""The programs `scripts/bench/allreduce` times: each strategy's mean of a per-device gradient
pytree over the mesh, once per call and repeated inside one program, and its random inputs."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from jia_jax import allreduce
from jia_jax import mesh as mesh_lib

PLAIN = "plain"


def is_shape(x: Any) -> bool:
    return isinstance(x, tuple)


@dataclasses.dataclass(frozen=True)
class Payload:
    """A gradient pytree to reduce: its leaf shapes and how its strategies bucket it."""

    name: str
    shapes: Any  # pytree of shape tuples
    bucket_bytes: tuple[int, ...]  # one row per value for the bucketing strategies

    def num_elements(self) -> int:
        return sum(math.prod(s) for s in self.leaf_shapes())

    def leaf_shapes(self) -> list[tuple[int, ...]]:
        return jax.tree.leaves(self.shapes, is_leaf=is_shape)


@dataclasses.dataclass(frozen=True)
class Case:
    """One measurement: a strategy reducing a payload in a wire dtype on a mesh shape."""

    dtype: str
    mesh: tuple[int, int]
    payload: Payload
    strategy: str
    bucket_bytes: int | None  # None for `xla` and `plain`, which do not bucket

    def key(self) -> tuple:
        """Identifies the inputs (payload, dtype, mesh) the case shares with its neighbours."""
        return (self.payload.name, self.dtype, self.mesh)


def reducer(case: Case, mesh: jax.sharding.Mesh, crossover_bytes: int) -> Callable[[Any], Any]:
    """The jitted program of `case`; its argument is stacked per device (leading axis = device)."""
    batch = P(mesh_lib.BATCH_AXES)
    wire = jnp.dtype(case.dtype)
    if case.strategy == "xla":
        # The trainer's 'xla' path: the mean over the stacked device axis as ordinary array code.
        def mean(tree):
            return allreduce.stacked_mean(tree, wire)

        return jax.jit(mean, out_shardings=NamedSharding(mesh, P()))
    if case.strategy == PLAIN:

        def per_device(flat):
            return jax.lax.psum(flat[0], mesh_lib.BATCH_AXES)
    else:
        mean = _strategy_mean(case, crossover_bytes)

        def per_device(tree):
            return mean(jax.tree.map(lambda g: g[0], tree))

    return jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=batch, out_specs=P()))


def _strategy_mean(case: Case, crossover_bytes: int) -> Callable[[Any], Any]:
    """`case`'s strategy as the trainer runs it: per-device tree -> mean over the mesh."""

    def mean(tree):
        return allreduce.reduce_gradients(
            tree,
            strategy=case.strategy,
            bucket_bytes=case.bucket_bytes,
            wire_dtype=jnp.dtype(case.dtype),
            hybrid_crossover_bytes=crossover_bytes,
            node_axis=mesh_lib.NODE_AXIS,
            gpu_axis=mesh_lib.GPU_AXIS,
        )

    return mean


def _perturb(tree: Any) -> Any:
    """Each leaf times 0.5 or 2 (exact in every float format), alternating over the leaves.

    In the repeated program below, this elementwise pass stands for the backward kernels that
    produce the gradients, and it keeps XLA from folding one iteration's unpacking (slices) into
    the next one's packing (a concatenate of those very slices) as a no-op.
    """
    leaves, treedef = jax.tree.flatten(tree)
    return treedef.unflatten(
        [leaf * jnp.asarray(0.5 if i % 2 else 2.0, leaf.dtype) for i, leaf in enumerate(leaves)]
    )


def looped_reducer(
    case: Case, mesh: jax.sharding.Mesh, crossover_bytes: int
) -> Callable[[Any, jax.Array], Any]:
    """`case`'s reduction repeated `iterations` times inside one program: `f(arg, iterations)`.

    Timing two iteration counts and taking the difference gives the device time of one reduction
    with the host's dispatch cost (which grows with the number of argument buffers: 161 leaves
    per device for the ResNet-50 tree) cancelled out: inside the train step the gradients are
    intermediate values, never arguments.
    """
    batch = P(mesh_lib.BATCH_AXES)
    devices = mesh.devices.size
    wire = jnp.dtype(case.dtype)
    if case.strategy == "xla":
        stacked = NamedSharding(mesh, batch)

        def mean(tree):
            means = allreduce.stacked_mean(tree, wire)
            # Back to one row per device (local: every device holds the mean).
            return jax.tree.map(
                lambda m, g: jax.lax.with_sharding_constraint(
                    jnp.broadcast_to(m[None], g.shape), stacked
                ),
                means,
                tree,
            )

        def repeat(tree, iterations):
            return jax.lax.fori_loop(0, iterations, lambda _, t: mean(_perturb(t)), tree)

        return jax.jit(repeat)

    if case.strategy == PLAIN:

        def once(flat):
            return jax.lax.psum(_perturb(flat), mesh_lib.BATCH_AXES) / devices
    else:
        mean = _strategy_mean(case, crossover_bytes)

        def once(tree):
            return mean(_perturb(tree))

    def per_device(tree, iterations):
        local = jax.tree.map(lambda g: g[0], tree)
        out = jax.lax.fori_loop(0, iterations, lambda _, t: once(t), local)
        return jax.tree.map(lambda g: g[None], out)

    return jax.jit(
        jax.shard_map(
            per_device, mesh=mesh, in_specs=(batch, P()), out_specs=batch, check_vma=False
        )
    )


def stacked_inputs(shapes: Any, dtype: str, mesh: jax.sharding.Mesh, seed: int) -> Any:
    """Random per-device gradients: each leaf `(devices, *shape)`, split over the devices."""
    leaves, treedef = jax.tree.flatten(shapes, is_leaf=is_shape)
    devices = mesh.devices.size
    sizes = [math.prod(s) for s in leaves]

    def make(key):
        # One random draw cut into the leaves: a draw per leaf compiles slowly for trees of 100s.
        flat = jax.random.normal(key, (devices, sum(sizes)), dtype)
        offsets = np.cumsum([0, *sizes])
        return treedef.unflatten(
            [
                flat[:, a:b].reshape(devices, *s)
                for a, b, s in zip(offsets[:-1], offsets[1:], leaves)
            ]
        )

    # Made on the devices: no host copy of buffers of hundreds of MiB.
    sharding = NamedSharding(mesh, P(mesh_lib.BATCH_AXES))
    return jax.block_until_ready(jax.jit(make, out_shardings=sharding)(jax.random.key(seed)))
