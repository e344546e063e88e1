"""The rules of gradient bucketing that the all-reduce runs and its cost model prices.

`jia_jax.allreduce` packs the gradients into buckets and picks each bucket's collective by these
rules; `jia_jax.comm_model` (free of JAX) prices the buckets they give. One definition, so the
model prices the plan the step runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

# `comm.dtype` of the fp8 wire (jia_jax/fp8_wire.py): each bucket's mean as an all-to-all and an
# all-gather of scaled 1-byte chunks (between two devices one all-gather), over every device
# (flat) or across nodes (hierarchical).
FP8_WIRE = "float8_e4m3fn"


def packing_order(
    order: Sequence[int], ndims: Sequence[int], vectors_last: bool
) -> tuple[int, ...]:
    """The leaves' packing order: `order` (leaf indices in the order backward produces their
    gradients), with the vectors (leaves of fewer than two dimensions, `ndims[i] < 2`: BatchNorm's
    scale and bias, biases) moved after the kernels where `vectors_last`, each group in its order.

    The buckets fill in this order, so the vectors ride in the last bucket, the one that leaves
    once backward ends (`allreduce.reduce_buckets` holds them there behind one barrier). Consumed
    by buckets that leave during backward, BatchNorm's scale and bias gradients made XLA fuse
    BatchNorm's backward worse on a GPU: ReLU's masked gradient written out and read again where
    it folds into the reductions (docs/benchmarks.md, "Why does the step compute longer across
    hosts?").
    """
    if not vectors_last:
        return tuple(order)
    vectors = vector_leaves(order, ndims)
    return tuple(i for i in order if i not in vectors) + vectors


def vector_leaves(order: Sequence[int], ndims: Sequence[int]) -> tuple[int, ...]:
    """The leaves of `order` with fewer than two dimensions (`ndims[i] < 2`: BatchNorm's scale
    and bias, biases), in that order."""
    return tuple(i for i in order if ndims[i] < 2)


def greedy_buckets(
    sizes: Sequence[int],
    itemsize: int,
    bucket_bytes: int,
    first_bucket_bytes: int = 0,
    last_bucket_bytes: int = 0,
) -> list[list[int]]:
    """Tensor fusion: the positions in `sizes` (element counts, in packing order) of each bucket.

    A tensor joins the current bucket while the bucket stays within `bucket_bytes` at `itemsize`
    bytes a value (the first bucket within `first_bucket_bytes` unless 0); a larger tensor gets a
    bucket of its own; empty tensors are left out. With `last_bucket_bytes` (unless 0) the last
    tensors within it form the last bucket of their own (the last tensor alone where it is
    larger), and the others are packed before it as above.
    """
    positions = [p for p, size in enumerate(sizes) if size]
    tail = _last_bucket(positions, sizes, itemsize, last_bucket_bytes) if last_bucket_bytes else []
    del positions[len(positions) - len(tail):]
    buckets: list[list[int]] = []
    current: list[int] = []
    used = 0  # Elements in `current`.
    limit = first_bucket_bytes or bucket_bytes
    for position in positions:
        size = sizes[position]
        if current and (used + size) * itemsize > limit:
            buckets.append(current)
            current, used, limit = [], 0, bucket_bytes
        current.append(position)
        used += size
    return [b for b in (*buckets, current, tail) if b]


def _last_bucket(
    positions: Sequence[int], sizes: Sequence[int], itemsize: int, limit: int
) -> list[int]:
    """The last of `positions` whose sizes stay within `limit` bytes together (at least one)."""
    tail: list[int] = []
    used = 0
    for position in reversed(positions):
        used += sizes[position]
        if tail and used * itemsize > limit:
            break
        tail.insert(0, position)
    return tail


def is_fp8_wire(wire_dtype: Any) -> bool:
    """Whether `wire_dtype`, a `comm.dtype` name or a dtype (or scalar type), is the fp8 wire."""
    name = wire_dtype if isinstance(wire_dtype, str) else np.dtype(wire_dtype).name
    return name == FP8_WIRE


def concatenated(packed: bool, wire_dtype: Any) -> bool:
    """Whether each bucket is sent as one array: where asked (`comm.concatenate_buckets`), and
    always on the fp8 wire, whose chunks are scaled over a whole bucket."""
    return packed or is_fp8_wire(wire_dtype)


def reduces_hierarchically(strategy: str, nbytes: int, crossover_bytes: int) -> bool:
    """Whether `strategy` reduces a bucket of `nbytes` in the hierarchical stages. Jia et al.:
    the hierarchical all-reduce beats the flat ring for small messages (fewer latency-bound
    steps); for large ones the ring's bandwidth optimality wins (`hybrid` switches at
    `crossover_bytes`)."""
    return strategy == "hierarchical" or (strategy == "hybrid" and nbytes < crossover_bytes)
