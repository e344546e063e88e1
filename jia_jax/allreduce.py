"""Gradient all-reduce: tensor fusion into buckets, then flat, hierarchical or hybrid collectives.

Jia et al. 2018 pack the many small gradient tensors into fused buffers ("tensor fusion") and reduce
them with a hierarchical all-reduce (reduce inside a node, all-reduce across nodes, broadcast inside
the node), switching to a flat ring for large buffers ("hybrid"). Here a static `BucketPlan` decides
the fusion from shapes alone, and `reduce_gradients` runs the chosen collective on each bucket.
Call it inside a `jax.shard_map` whose mesh has a cross-host axis ("node") and an intra-host axis
("gpu"), both manual.

Example (8 devices as a 2x4 mesh, one gradient per device):

    mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(2, 4), ("node", "gpu"))
    spec = jax.sharding.PartitionSpec(("node", "gpu"))

    @jax.jit
    @jax.shard_map(mesh=mesh, in_specs=spec, out_specs=jax.sharding.PartitionSpec())
    def mean_grad(g):
      return reduce_gradients(g[0], strategy="hierarchical", bucket_bytes=4 << 20,
                              wire_dtype="bfloat16", hybrid_crossover_bytes=1 << 20)
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jia_jax import bucketing
from jia_jax import fp8_wire

STRATEGIES = ("flat", "hierarchical", "hybrid")


@dataclasses.dataclass(frozen=True)
class Segment:
    """Where one gradient leaf sits inside a bucket."""

    leaf: int  # Index into `jax.tree_util.tree_leaves` of the gradient tree.
    offset: int  # First element of the leaf in the flat bucket.
    size: int  # Number of elements.


@dataclasses.dataclass(frozen=True)
class BucketPlan:
    """Static packing of a pytree's leaves into flat 1-D buckets.

    Attributes:
      treedef: Structure of the tree the plan was made for.
      shapes: Shape of every leaf, in `tree_leaves` order.
      dtypes: Dtype of every leaf, in `tree_leaves` order.
      wire_dtype: Dtype of every bucket.
      buckets: For each bucket, its segments in packing order. Leaves are taken last-first (the
        order backward produces them); zero-size leaves are in no bucket.
      held: Leaves (indices) that pass through one `optimization_barrier` together before
        packing: the vectors where they ride last (`vectors_last`), else none.
    """

    treedef: Any
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[np.dtype, ...]
    wire_dtype: np.dtype
    buckets: tuple[tuple[Segment, ...], ...]
    held: tuple[int, ...] = ()

    def bucket_sizes(self) -> tuple[int, ...]:
        """Number of elements in each bucket."""
        return tuple(sum(s.size for s in b) for b in self.buckets)

    def bucket_nbytes(self) -> tuple[int, ...]:
        """Bytes of each bucket in the wire dtype."""
        return tuple(n * self.wire_dtype.itemsize for n in self.bucket_sizes())


def plan_buckets(
    tree: Any,
    bucket_bytes: int,
    wire_dtype: Any,
    leaf_order: Sequence[int] | None = None,
    first_bucket_bytes: int = 0,
    last_bucket_bytes: int = 0,
    vectors_last: bool = False,
) -> BucketPlan:
    """Plans tensor fusion for a pytree of arrays (or `jax.ShapeDtypeStruct`s).

    Leaves are visited in `leaf_order` (default: reverse `tree_leaves` order) and appended greedily
    to the current bucket while it stays within `bucket_bytes` (counted in `wire_dtype`). A leaf
    larger than the limit gets a bucket of its own, so `bucket_bytes=0` means one bucket per leaf.

    Args:
      tree: Pytree whose leaves have `.shape` and `.dtype`.
      bucket_bytes: Largest size of a bucket holding several leaves, in bytes; >= 0.
      wire_dtype: Dtype the buckets are sent in, e.g. "float32", "bfloat16", "float16".
      leaf_order: Indices into `tree_leaves(tree)` in the order backward produces the gradients
        (`jia_jax.models.call_order.backward_leaf_order`); a permutation of all leaves.
      first_bucket_bytes: The limit of the first bucket (the gradients backward produces first);
        0 = `bucket_bytes`.
      last_bucket_bytes: The limit of the last bucket (the gradients backward produces last,
        which can only leave after it), taken from the end; 0 = no limit of its own.
      vectors_last: Pack the vectors (leaves of fewer than two dimensions) after the kernels,
        into the last bucket, and hold them behind one barrier (`bucketing.packing_order`).

    Returns:
      The plan; it depends only on shapes, dtypes and the arguments.
    """
    if bucket_bytes < 0:
        raise ValueError(f"comm.bucket_bytes must be >= 0, got {bucket_bytes}.")
    for name, value in (("first", first_bucket_bytes), ("last", last_bucket_bytes)):
        if value < 0:
            raise ValueError(f"comm.{name}_bucket_bytes must be >= 0, got {value}.")
    wire = jnp.dtype(wire_dtype)
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    shapes = tuple(tuple(int(d) for d in leaf.shape) for leaf in leaves)
    dtypes = tuple(np.dtype(leaf.dtype) for leaf in leaves)

    order = tuple(reversed(range(len(leaves)))) if leaf_order is None else tuple(leaf_order)
    if sorted(order) != list(range(len(leaves))):
        raise ValueError(f"leaf_order must be a permutation of the {len(leaves)} leaf indices.")
    ndims = [len(s) for s in shapes]
    order = bucketing.packing_order(order, ndims, vectors_last)
    held = bucketing.vector_leaves(order, ndims) if vectors_last else ()

    sizes = [math.prod(shapes[i]) for i in order]
    buckets = []
    groups = bucketing.greedy_buckets(
        sizes, wire.itemsize, bucket_bytes, first_bucket_bytes, last_bucket_bytes
    )
    for positions in groups:
        offsets = itertools.accumulate((sizes[p] for p in positions), initial=0)
        buckets.append(tuple(
            Segment(leaf=order[p], offset=offset, size=sizes[p])
            for p, offset in zip(positions, offsets)
        ))
    return BucketPlan(treedef, shapes, dtypes, wire, tuple(buckets), held)


def split(tree: Any, plan: BucketPlan) -> list[tuple[jax.Array, ...]]:
    """The plan's buckets, each as its leaves, flattened and cast to `packed_dtype`, in packing
    order (`pack` without the concatenation)."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    if treedef != plan.treedef:
        raise ValueError(f"Tree structure {treedef} does not match the plan's {plan.treedef}.")
    dtype = packed_dtype(plan)
    return [
        tuple(jnp.ravel(leaves[s.leaf]).astype(dtype) for s in bucket) for bucket in plan.buckets
    ]


def packed_dtype(plan: BucketPlan) -> np.dtype:
    """The dtype of the packed buckets: the wire's, but for an fp8 wire the gradients' own
    (`fp8_wire` scales each chunk into fp8 at the collective)."""
    if bucketing.is_fp8_wire(plan.wire_dtype):
        return np.dtype(jnp.result_type(*plan.dtypes)) if plan.dtypes else np.dtype(np.float32)
    return plan.wire_dtype


def pack(tree: Any, plan: BucketPlan) -> list[jax.Array]:
    """Flattens `tree` into the plan's buckets, cast to `packed_dtype`."""
    return [jnp.concatenate(parts) for parts in split(tree, plan)]


def _pieces(bucket: jax.Array | Sequence[jax.Array], segments) -> list[jax.Array]:
    """A bucket's segments as flat arrays: sliced from a packed bucket, or a split one's own."""
    if isinstance(bucket, (tuple, list)):
        return list(bucket)
    return [jax.lax.slice_in_dim(bucket, s.offset, s.offset + s.size) for s in segments]


def unpack(
    buckets: Sequence[jax.Array | Sequence[jax.Array]], plan: BucketPlan, scale: float | None = None
) -> Any:
    """Inverse of `pack` (and of `split`: a bucket given as its leaves): rebuilds the tree with the
    original shapes and dtypes.

    With `scale`, each leaf is multiplied by it in fp32 before the cast back to its dtype.
    """
    if len(buckets) != len(plan.buckets):
        raise ValueError(f"Expected {len(plan.buckets)} buckets, got {len(buckets)}.")
    # Zero-size leaves are in no bucket; every other entry is filled below.
    leaves = [
        jnp.zeros(shape, dtype) if math.prod(shape) == 0 else None
        for shape, dtype in zip(plan.shapes, plan.dtypes)
    ]
    for bucket, segments in zip(buckets, plan.buckets):
        for s, piece in zip(segments, _pieces(bucket, segments)):
            if scale is not None:
                piece = piece.astype(jnp.float32) * scale
            leaves[s.leaf] = piece.reshape(plan.shapes[s.leaf]).astype(plan.dtypes[s.leaf])
    return plan.treedef.unflatten(leaves)


def _flat_sum(x: jax.Array, node_axis: str, gpu_axis: str) -> jax.Array:
    return jax.lax.psum(x, (node_axis, gpu_axis))


def _hierarchical_sum(x: jax.Array, node_axis: str, gpu_axis: str) -> jax.Array:
    # Reduce-scatter inside the node, all-reduce of 1/gpus of the bytes across nodes, all-gather
    # inside the node: Horovod's form of the paper's reduce -> all-reduce -> broadcast.
    gpus = jax.lax.axis_size(gpu_axis)
    if gpus == 1 or jax.lax.axis_size(node_axis) == 1:
        # One level has a single member: the three stages move the same bytes as one all-reduce
        # over the other level, which NCCL runs as one kernel instead of three (measured in
        # docs/benchmarks.md: two launches and a dependency fewer per bucket).
        # Over both axes: the same replica groups (one of them has a single member), and the
        # result is typed as replicated over both, as the three stages' result is.
        return jax.lax.psum(x, (node_axis, gpu_axis))
    return _across_node_shards(x, gpu_axis, lambda shard: jax.lax.psum(shard, node_axis))


def _across_node_shards(
    x: jax.Array, gpu_axis: str, across: Callable[[jax.Array], jax.Array]
) -> jax.Array:
    """The hierarchical stages around `across`: `x` reduce-scattered inside the node, `across`
    of each device's shard (its reduction over the nodes), the results all-gathered inside the
    node."""
    gpus = jax.lax.axis_size(gpu_axis)
    pad = -x.shape[0] % gpus  # Reduce-scatter needs equal shards.
    padded = jnp.pad(x, (0, pad)) if pad else x
    shard = jax.lax.psum_scatter(padded, gpu_axis, scatter_dimension=0, tiled=True)
    # Every device of a node ends with the same values; saying so lets callers return the result
    # with a replicated out_spec.
    full = jax.lax.all_gather(across(shard), gpu_axis, axis=0, tiled=True, to="invarying")
    return full[: x.shape[0]] if pad else full


def _fp8_mean(x: jax.Array, hierarchical: bool, node_axis: str, gpu_axis: str) -> jax.Array:
    """The mean of bucket `x` over every device with an fp8 wire (`fp8_wire.mean`): over all of
    them at once (flat), or (hierarchical) only across nodes: reduce-scatter inside the node in
    `x`'s dtype, the mean of the shards across nodes in fp8, all-gather inside the node in `x`'s
    dtype. With several GPUs a node, the flat all-to-all sends every GPU's chunks across the
    network; the hierarchical form sends 1/gpus of the bucket per GPU, in fp8."""
    gpus, nodes = jax.lax.axis_size(gpu_axis), jax.lax.axis_size(node_axis)
    both = (node_axis, gpu_axis)
    if not hierarchical or gpus == 1:
        return fp8_wire.mean(x, both)
    if nodes == 1:  # nothing crosses a network: no fp8
        return jax.lax.psum(x, both).astype(jnp.float32) / gpus
    return _across_node_shards(
        x, gpu_axis, lambda shard: (fp8_wire.mean(shard, node_axis) / gpus).astype(x.dtype)
    )


def _check_reducible(grads: Any, strategy: str) -> None:
    """Raises where `reduce_gradients` cannot average `grads` with `strategy`: 'xla' (XLA's own
    all-reduce, not this function's), an unknown strategy, or a leaf that is not floating-point."""
    if strategy == "xla":
        raise ValueError(
            "comm.strategy='xla' leaves the all-reduce to XLA; the step must not call "
            "reduce_gradients."
        )
    if strategy not in STRATEGIES:
        raise ValueError(
            f"Unknown comm.strategy {strategy!r}; expected 'xla' or one of {STRATEGIES}."
        )
    for leaf in jax.tree_util.tree_leaves(grads):
        if not jnp.issubdtype(leaf.dtype, jnp.inexact):
            raise TypeError(f"reduce_gradients averages floating-point leaves, got {leaf.dtype}.")


def reduce_gradients(
    grads: Any,
    *,
    strategy: str,
    bucket_bytes: int,
    wire_dtype: Any,
    hybrid_crossover_bytes: int,
    node_axis: str = "node",
    gpu_axis: str = "gpu",
    leaf_order: Sequence[int] | None = None,
    overlap: bool = False,
    first_bucket_bytes: int = 0,
    last_bucket_bytes: int = 0,
    after_backward: bool = False,
    packed: bool = True,
    release_before_last: bool = False,
    vectors_last: bool = False,
) -> Any:
    """Averages per-device gradients over every device of the mesh.

    Call inside a `jax.shard_map` in which `node_axis` and `gpu_axis` are manual.

    Args:
      grads: Pytree of floating-point per-device gradients.
      strategy: "flat" (one all-reduce over both axes per bucket), "hierarchical" (reduce-scatter
        over gpu, all-reduce over node, all-gather over gpu) or "hybrid" (hierarchical for buckets
        smaller than `hybrid_crossover_bytes`, flat for the others).
      bucket_bytes, first_bucket_bytes, last_bucket_bytes, leaf_order: The buckets' limits and
        the leaves' order, see `plan_buckets`.
      wire_dtype: Dtype of the buckets on the wire; with "float8_e4m3fn" each bucket's mean
        crosses the network as `fp8_wire.mean` sends it, scaled chunks in fp8 (`_fp8_mean`).
      hybrid_crossover_bytes: Bucket size (wire bytes) from which "hybrid" uses the flat all-reduce.
      node_axis, gpu_axis: Mesh axes across hosts and across the devices of one host.
      overlap: Let each bucket's collective run while backward computes the buckets after it
        (`hold_until_all_reduced`); the values are the same.
      after_backward: Pack the buckets only once backward has produced every gradient
        (`hold_until_backward_ends`); no bucket then leaves during backward. Same values.
      packed: Concatenate each bucket into one array for its all-reduce; False sends a bucket
        reduced flat as a `psum` of its leaves (no copy into a bucket; XLA's combiner merges the
        all-reduces as its thresholds allow), and concatenates a hierarchical one only for its
        reduce-scatter (and an fp8 one always). The same sums, up to their order.
      release_before_last: With `overlap`, release the buckets before the last once backward
        has packed the last (`hold_until_all_but_last_reduced`), not once the last is reduced:
        their leaves' update may run under the last bucket's all-reduce. The values are the same.
      vectors_last: The vectors (BatchNorm's scale and bias, biases) in the last bucket, held
        until all exist (`bucketing.packing_order`). The values are the same.

    Returns:
      The mean over all devices, same structure, shapes and dtypes as `grads`, identical on every
      device.
    """
    _check_reducible(grads, strategy)
    if jax.lax.axis_size((node_axis, gpu_axis)) == 1:
        # The mean over one device is its gradient. Packing it anyway is not free: consumed by
        # the buckets, BatchNorm's backward was fused worse by XLA (ReLU's mask written out
        # instead of fused into the reductions), -3.5% of ResNet-50's images/s on one H200
        # (docs/benchmarks.md, "One GPU").
        return grads
    plan = plan_buckets(
        grads, bucket_bytes, wire_dtype, leaf_order, first_bucket_bytes, last_bucket_bytes,
        vectors_last,
    )
    return reduce_buckets(
        grads,
        plan,
        strategy=strategy,
        hybrid_crossover_bytes=hybrid_crossover_bytes,
        node_axis=node_axis,
        gpu_axis=gpu_axis,
        overlap=overlap,
        after_backward=after_backward,
        packed=packed,
        release_before_last=release_before_last,
    )


def reduce_buckets(
    grads: Any,
    plan: BucketPlan,
    *,
    strategy: str,
    hybrid_crossover_bytes: int,
    node_axis: str = "node",
    gpu_axis: str = "gpu",
    overlap: bool = False,
    after_backward: bool = False,
    packed: bool = True,
    release_before_last: bool = False,
) -> Any:
    """`reduce_gradients` of `grads` packed as `plan` says, without its checks and its one-device
    shortcut: the buckets are packed and reduced even where the mesh has one device."""
    devices = jax.lax.axis_size((node_axis, gpu_axis))
    fp8 = bucketing.is_fp8_wire(plan.wire_dtype)
    divide_first = divide_before_sum(plan.wire_dtype) and not fp8
    if divide_first:
        # fp16's range is small: divide in fp32 before the cast, so the sum on the wire is bounded
        # by the largest per-device gradient; with a loss scale, summing first can overflow to inf
        # (a false overflow that skips the step) once many devices add up. Pre-dividing can only
        # underflow tiny entries, which loss scaling keeps rare and which cost far less than an inf.
        grads = jax.tree_util.tree_map(lambda g: g.astype(jnp.float32) / devices, grads)
    if after_backward:
        grads = hold_until_backward_ends(grads)
    elif plan.held:
        grads = hold_together(grads, plan.held)
    packed = bucketing.concatenated(packed, plan.wire_dtype)
    buckets = pack(grads, plan) if packed else split(grads, plan)

    def reduce(bucket, segments, nbytes):
        hierarchical = bucketing.reduces_hierarchically(strategy, nbytes, hybrid_crossover_bytes)
        if fp8:  # the mean itself: scaled chunks cannot be summed on the wire
            return _fp8_mean(bucket, hierarchical, node_axis, gpu_axis)
        if not hierarchical:
            return _flat_sum(bucket, node_axis, gpu_axis)
        if packed:
            return _hierarchical_sum(bucket, node_axis, gpu_axis)
        # The reduce-scatter needs one array to shard.
        total = _hierarchical_sum(jnp.concatenate(bucket), node_axis, gpu_axis)
        return tuple(_pieces(total, segments))

    stages = list(zip(buckets, plan.buckets, plan.bucket_nbytes()))
    if overlap and release_before_last and stages:
        reduced = [reduce(*stage) for stage in stages[:-1]]
        reduced, last = hold_until_all_but_last_reduced(reduced, stages[-1][0])
        reduced.append(reduce(last, *stages[-1][1:]))
    else:
        reduced = [reduce(*stage) for stage in stages]
        if overlap:
            reduced = hold_until_all_reduced(reduced)
    # The plan was made from `grads`' own dtypes, so `unpack` restores them. fp32 and bf16 share
    # fp32's exponent range, so their sums cannot overflow where the gradients did not: they are
    # divided here, where the division fuses into the slices' consumers (no pass of its own).
    scale = None if divide_first or fp8 else 1.0 / devices
    return unpack(reduced, plan, scale=scale)


def pmean_packed(tree: Any, axes: tuple[str, ...]) -> Any:
    """`jax.lax.pmean(tree, axes)` of a tree of fp32 scalars and small arrays (BatchNorm
    statistics, metrics) as one collective: one fp32 bucket instead of one per leaf; on one
    device the tree itself, as `reduce_gradients` returns one device's gradients."""
    if jax.lax.axis_size(axes) == 1:
        return tree
    plan = plan_buckets(jax.tree_util.tree_map(jnp.asarray, tree), 1 << 62, jnp.float32)
    summed = [jax.lax.psum(flat, axes) for flat in pack(tree, plan)]
    return unpack(summed, plan, scale=1.0 / jax.lax.axis_size(axes))


def hold_until_backward_ends(grads: Any) -> Any:
    """`grads` with every leaf passed through one `optimization_barrier`: an identity whose
    leaves exist only once all of them do.

    Consumed by the buckets as backward produces them, BatchNorm's backward was fused worse by
    XLA on a GPU: ReLU's masked gradient written out in fusions of its own and read again by the
    reductions, where a step without buckets folds the mask into them (docs/benchmarks.md, "Does
    packing the gradients change how XLA fuses backward?"). Behind one barrier the packing starts
    after backward and XLA fuses backward as without buckets; a barrier over each bucket's own
    leaves did not. The price: no bucket leaves while backward runs, which across hosts is where
    the wire time hides (`comm.pack_after_backward`). Holding only the vectors for the last
    bucket (`plan_buckets`' `vectors_last`) keeps that fusion at no such price.
    """
    return jax.lax.optimization_barrier(grads)


def hold_together(grads: Any, leaves: Sequence[int]) -> Any:
    """`grads` with the leaves at `leaves` (indices into `tree_leaves`) passed through one
    `optimization_barrier`: each of them exists only once all of them do. An identity."""
    flat, treedef = jax.tree_util.tree_flatten(grads)
    for i, leaf in zip(leaves, jax.lax.optimization_barrier(tuple(flat[i] for i in leaves))):
        flat[i] = leaf
    return treedef.unflatten(flat)


def hold_until_all_reduced(reduced: list[Any]) -> list[Any]:
    """The reduced buckets, each usable only once every bucket is reduced.

    Backward fills the buckets one after another, so each bucket's all-reduce can start as soon as
    its last gradient exists, while backward computes the buckets below it (PyTorch DDP's and
    Horovod's overlap). XLA's GPU scheduler starts an asynchronous all-reduce as early as its
    operands allow and waits for it just before its first consumer; left alone, the consumers of
    a bucket (the slices back into leaves) were placed right after it, so XLA waited for each
    bucket where it started and the wire time added to the step (docs/benchmarks.md, "Across
    hosts"). One `optimization_barrier` over all the reduced buckets gives every bucket's
    consumers the last bucket's completion as a dependency: each wait moves to the end of
    backward, where the optimizer needs all gradients anyway. An identity: values are unchanged.
    """
    return list(jax.lax.optimization_barrier(tuple(reduced)))


def hold_until_all_but_last_reduced(
    reduced: list[Any], last_bucket: Any
) -> tuple[list[Any], Any]:
    """The reduced buckets before the last, and the last bucket's packed gradients, each usable
    only once all of them exist.

    `hold_until_all_reduced` without the last bucket's wait: the buckets before it are released
    where backward has packed the last one, so whatever reads them (the optimizer's update of
    their leaves) may run while the last bucket's all-reduce is on the wire, which starts there
    too; only the last bucket's own leaves wait for it. An identity: values are unchanged.
    """
    *held, last = jax.lax.optimization_barrier((*reduced, last_bucket))
    return held, last


def stacked_mean(grads: Any, wire_dtype: Any) -> Any:
    """Mean over the leading (device) axis of each leaf, summed in `wire_dtype`.

    `comm.strategy='xla'`: written as array code on per-device values stacked along a sharded
    axis, so XLA places and combines the all-reduces. Divides before or after the sum as
    `reduce_gradients` does (before for fp16, whose range a sum over many devices can overflow).
    """
    wire = jnp.dtype(wire_dtype)
    if bucketing.is_fp8_wire(wire):
        raise ValueError(fp8_wire.NOT_BY_XLA)
    first = divide_before_sum(wire)

    def mean(g: jax.Array) -> jax.Array:
        n = g.shape[0]
        addends = (g.astype(jnp.float32) / n if first else g).astype(wire)
        # Not `jnp.sum`: it accumulates bf16/fp16 in fp32, and the all-reduce XLA makes of the
        # reduction would then carry fp32, twice the wire's bytes.
        total = jax.lax.reduce(addends, np.array(0, wire), jax.lax.add, (0,))
        return (total if first else total.astype(jnp.float32) / n).astype(g.dtype)

    return jax.tree_util.tree_map(mean, grads)


def divide_before_sum(wire_dtype: Any) -> bool:
    """Whether a mean in `wire_dtype` must divide each addend first (fp16's range) or may sum."""
    return jnp.finfo(jnp.dtype(wire_dtype)).maxexp < jnp.finfo(jnp.float32).maxexp
