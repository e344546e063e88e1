"""The trainer's step with its update sharded over the devices, for `scripts/bench/overlap.py`.

Across a slow network the trainer all-reduces every gradient byte during backward: with 2
devices each sends the whole gradient once, and at 64 images per GPU that takes about half the
one-GPU step (docs/benchmarks.md, "Where does the trainer stand across hosts"). Sharding the
update (Rajbhandari et al. 2020, ZeRO; Xu et al. 2020, "Automatic Cross-Replica Sharding of
Weight Update in Data-Parallel Training") splits those bytes in two halves: each device keeps
1/n of the fp32 master weights and of the LARS momentum; backward reduce-scatters the gradient
buckets (each device sends (n-1)/n of a bucket, half of an all-reduce's bytes), the device
updates its shard, and the next step all-gathers the bf16 weights, under its forward. The
update is the trainer's: LARS with its norms per leaf summed over the shards (one all-reduce of
two floats a leaf), bf16 gradients summed on the wire and divided in fp32 as
`allreduce.reduce_buckets` does, BatchNorm statistics and metrics averaged as the trainer does.

Layout: the buckets are `allreduce.plan_buckets`' (backward order); within a bucket each leaf is
cut into n equal chunks (zero-padded), and the bucket is laid out device-major (every leaf's
chunk 0, then every leaf's chunk 1, ...), so a tiled reduce-scatter hands device d its own chunk
of every leaf and every leaf's norm is a sum over a static slice of each shard.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jia_jax import allreduce, precision, train
from jia_jax import mesh as mesh_lib
from jia_jax.lars import trust_ratio
from jia_jax.models import call_order


class ShardedState(flax.struct.PyTreeNode):
    """The state of the sharded step: each bucket's weights and momentum sharded over the
    devices (flat fp32, device-major), the rest replicated."""

    step: jax.Array
    count: jax.Array  # updates applied: the learning-rate schedule's argument
    weights: tuple[jax.Array, ...]
    momentum: tuple[jax.Array, ...]
    batch_stats: Any


@dataclasses.dataclass(frozen=True)
class ShardLayout:
    """Where each leaf's chunk sits in its bucket's shard: `offsets[b][k]` and `chunks[b][k]` for
    the bucket's k-th segment (`plan.buckets[b][k]`); `shard_sizes[b]` the shard's length."""

    plan: allreduce.BucketPlan
    devices: int
    offsets: tuple[tuple[int, ...], ...]
    chunks: tuple[tuple[int, ...], ...]
    shard_sizes: tuple[int, ...]


def shard_layout(plan: allreduce.BucketPlan, devices: int) -> ShardLayout:
    """The device-major layout of `plan`'s buckets over `devices` shards."""
    chunks = tuple(tuple(-(-s.size // devices) for s in bucket) for bucket in plan.buckets)
    offsets = tuple(tuple(np.cumsum((0, *c[:-1])).tolist()) for c in chunks)
    return ShardLayout(plan, devices, offsets, chunks, tuple(sum(c) for c in chunks))


def to_buckets(leaves: list[jax.Array], layout: ShardLayout, dtype: Any) -> list[jax.Array]:
    """Flat leaves (`tree_leaves` order) as the layout's full buckets in `dtype`, device-major."""
    out = []
    for bucket, chunks in zip(layout.plan.buckets, layout.chunks):
        # Each leaf as [devices, chunk] rows, side by side: row d is device d's shard.
        rows = [
            jnp.pad(jnp.ravel(leaves[s.leaf]).astype(dtype), (0, c * layout.devices - s.size))
            .reshape(layout.devices, c)
            for s, c in zip(bucket, chunks)
        ]
        out.append(jnp.concatenate(rows, axis=1).ravel())
    return out


def from_buckets(buckets: list[jax.Array], layout: ShardLayout) -> Any:
    """The inverse of `to_buckets`: the tree with each leaf's shape (dtype of the buckets)."""
    leaves: list[Any] = [None] * len(layout.plan.shapes)
    for full, bucket, offsets, chunks in zip(
        buckets, layout.plan.buckets, layout.offsets, layout.chunks
    ):
        rows = full.reshape(layout.devices, -1)  # row d: device d's shard
        for s, o, c in zip(bucket, offsets, chunks):
            flat = rows[:, o:o + c].reshape(-1)[: s.size]  # the leaf's chunks, padding cut
            leaves[s.leaf] = flat.reshape(layout.plan.shapes[s.leaf])
    # Zero-size leaves are in no bucket.
    dtype = buckets[0].dtype
    leaves = [jnp.zeros(shape, dtype) if x is None else x
              for x, shape in zip(leaves, layout.plan.shapes)]
    return layout.plan.treedef.unflatten(leaves)


def leaf_sums_of_squares(
    shards: list[jax.Array], layout: ShardLayout, buckets: range | None = None
) -> jax.Array:
    """Each leaf's sum of squares over this device's shards (or a bucket's [devices, shard]
    rows: all of it), fp32, in `tree_leaves` order; leaves outside `buckets` (default all) 0."""
    sums = [jnp.zeros((), jnp.float32)] * len(layout.plan.shapes)
    for b in range(len(shards)) if buckets is None else buckets:
        for s, o, c in zip(layout.plan.buckets[b], layout.offsets[b], layout.chunks[b]):
            sums[s.leaf] = jnp.sum(jnp.square(shards[b][..., o:o + c].astype(jnp.float32)))
    return jnp.stack(sums)


def lars_shard_update(
    w: jax.Array, v: jax.Array, g: jax.Array, ratio: jax.Array, lr: jax.Array,
    segments: tuple, offsets: tuple, chunks: tuple, apply: tuple, cfg: ml_collections.ConfigDict,
) -> tuple[jax.Array, jax.Array]:
    """One bucket shard's (or its [devices, shard] rows') LARS step (`jia_jax.lars.lars`):
    `v <- m v + lr d`, `w <- w - v`, with `d = ratio (g + wd w)` where the leaf takes LARS and
    `d = g` where it does not."""
    parts = []
    for s, o, c in zip(segments, offsets, chunks):
        gs, ws = g[..., o:o + c], w[..., o:o + c]
        parts.append(ratio[s.leaf] * (gs + cfg.weight_decay * ws) if apply[s.leaf] else gs)
    new_v = cfg.momentum * v + lr * jnp.concatenate(parts, axis=-1)
    return w - new_v, new_v


def _body(
    model, learning_rate, config, mesh: Mesh, layout: ShardLayout, whole: range, hold: bool
) -> Callable:
    """The `shard_map`ped `(count, weights, momentum, batch_stats, batch, key) -> (weights,
    momentum, batch_stats, metrics)` of `make_sharded_step`: buckets in `whole` all-reduced and
    updated whole on every device, the others reduce-scattered and updated as shards; with
    `hold`, every reduced bucket behind one barrier (`allreduce.hold_until_all_reduced`)."""
    compute = precision.compute_dtype(config.precision.compute)
    wire = jnp.dtype(config.comm.dtype)
    devices, axes, opt = mesh.devices.size, mesh_lib.BATCH_AXES, config.optimizer
    split = range(len(whole), len(layout.shard_sizes))
    apply = tuple(len(shape) > 1 for shape in layout.plan.shapes)  # lars.exclude_bias_and_norm
    grads_fn = train.accumulate_microbatches(
        train.local_grads_fn(model, compute, config.loss.label_smoothing),
        config.microbatch_size, devices,
    )

    def rows(xs):  # a whole bucket as its [devices, shard] rows, a shard as it is
        return [x.reshape(devices, -1) if b in whole else x for b, x in enumerate(xs)]

    def per_device(count, weights, momentum, batch_stats, batch, key):
        # Forward needs the first layers first: gather the last bucket (backward's last) first.
        low = [None] * len(weights)
        for b in reversed(range(len(weights))):
            w = weights[b].astype(compute)
            low[b] = w if b in whole else jax.lax.all_gather(w, axes, tiled=True)
        key = jax.random.fold_in(key, train.device_index(mesh))
        grads, stats, metrics = grads_fn(from_buckets(low, layout), batch_stats, 1.0, batch, key)
        summed = [
            jax.lax.psum(g, axes) if b in whole
            else jax.lax.psum_scatter(g, axes, scatter_dimension=0, tiled=True)
            for b, g in enumerate(to_buckets(jax.tree.leaves(grads), layout, wire))
        ]
        if hold:
            summed = allreduce.hold_until_all_reduced(summed)
        # The trainer's mean: the wire's sum divided in fp32, rounded to the gradient's dtype.
        g = rows([(s.astype(jnp.float32) / devices).astype(compute).astype(jnp.float32)
                  for s in summed])
        w, v = rows(weights), rows(momentum)
        parts = jnp.stack([leaf_sums_of_squares(w, layout, split),
                           leaf_sums_of_squares(g, layout, split)])
        w_sq, g_sq = jax.lax.psum(parts, axes) + jnp.stack(
            [leaf_sums_of_squares(w, layout, whole), leaf_sums_of_squares(g, layout, whole)])
        ratio = trust_ratio(
            jnp.sqrt(w_sq), jnp.sqrt(g_sq), opt.weight_decay, opt.trust_coefficient
        )
        lr = jnp.asarray(learning_rate(count), jnp.float32)
        new = [
            lars_shard_update(*wvg, ratio, lr, segs, offs, chs, apply, opt)
            for *wvg, segs, offs, chs in zip(
                w, v, g, layout.plan.buckets, layout.offsets, layout.chunks)
        ]
        stats, metrics = allreduce.pmean_packed((stats, metrics), axes)
        metrics["learning_rate"] = lr
        flat = lambda xs: tuple(x.reshape(-1) for x in xs)  # noqa: E731
        return flat(w for w, _ in new), flat(v for _, v in new), stats, metrics

    specs = _specs(layout, whole, axes)
    return jax.shard_map(
        per_device, mesh=mesh,
        in_specs=(P(), specs, specs, P(), P(axes), P()),
        out_specs=(specs, specs, P(), P()),
        check_vma=False,
    )


def _specs(layout: ShardLayout, whole: range, axes) -> tuple[P, ...]:
    """Each bucket's partition: replicated where updated whole, else split over `axes`."""
    return tuple(P() if b in whole else P(axes) for b in range(len(layout.shard_sizes)))


def make_sharded_step(
    model, learning_rate: optax.Schedule, config: ml_collections.ConfigDict, mesh: Mesh,
    params: Any, image_shape: tuple[int, ...], replicated: int = 0, hold: bool = False,
) -> tuple[Callable, Callable[[train.TrainState], ShardedState]]:
    """`(step, shard)`: the jitted `step(state, batch) -> (state, metrics)` on a `ShardedState`,
    and `shard(trainer_state)` making one from the trainer's replicated state.

    The first `replicated` buckets (those backward fills first, with the most of backward left
    to hide under) are all-reduced instead and updated whole on every device, as the trainer
    does; only the later ones are sharded. With `hold`, the reduced buckets pass one barrier
    before anything reads them, as the trainer's do (`comm.overlap`): XLA then orders their
    collectives by when backward fills them, not by where their readers are scheduled."""
    if precision.needs_loss_scaling(precision.compute_dtype(config.precision.compute)):
        raise ValueError("the sharded step has no loss scaling: bf16 or fp32 compute only")
    if config.optimizer.name != "lars" or config.optimizer.nesterov:
        raise ValueError("the sharded step updates with LARS, without Nesterov")
    plan = allreduce.plan_buckets(
        params, config.comm.bucket_bytes, jnp.dtype(config.comm.dtype),
        call_order.backward_leaf_order(model, image_shape), config.comm.first_bucket_bytes,
        config.comm.last_bucket_bytes,
    )
    layout = shard_layout(plan, mesh.devices.size)
    whole = range(min(replicated, len(plan.buckets)))
    body = _body(model, learning_rate, config, mesh, layout, whole, hold)

    def step(state: ShardedState, batch: train.Batch):
        key = jax.random.fold_in(jax.random.PRNGKey(config.seed), state.step)
        weights, momentum, stats, metrics = body(
            state.count, state.weights, state.momentum, state.batch_stats, batch, key
        )
        new = state.replace(step=state.step + 1, count=state.count + 1, weights=weights,
                            momentum=momentum, batch_stats=stats)
        return new, metrics

    placed = [NamedSharding(mesh, spec) for spec in _specs(layout, whole, mesh_lib.BATCH_AXES)]

    def shard(state: train.TrainState) -> ShardedState:
        leaves = jax.tree.leaves(jax.device_get(state.params))
        momenta = jax.tree.leaves(jax.device_get(state.opt_state.momentum))
        put = lambda xs: tuple(map(jax.device_put, xs, placed))  # noqa: E731
        return ShardedState(
            step=state.step, count=state.opt_state.count,
            weights=put(to_buckets(leaves, layout, jnp.float32)),
            momentum=put(to_buckets(momenta, layout, jnp.float32)),
            batch_stats=state.batch_stats,
        )

    return jax.jit(step, donate_argnums=0), shard
