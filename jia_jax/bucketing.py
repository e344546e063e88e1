"""The rules of gradient bucketing that the all-reduce runs and its cost model prices.

`jia_jax.allreduce` packs the gradients into buckets and picks each bucket's collective by these
rules; `jia_jax.comm_model` (free of JAX) prices the buckets they give. One definition, so the
model prices the plan the step runs.
"""

from __future__ import annotations

from collections.abc import Sequence

# `comm.dtype` of the fp8 wire (jia_jax/fp8_wire.py): each bucket's mean as an all-to-all and an
# all-gather of scaled 1-byte chunks, over every device (flat) or across nodes (hierarchical).
FP8_WIRE = "float8_e4m3fn"


def greedy_buckets(
    sizes: Sequence[int], itemsize: int, bucket_bytes: int, first_bucket_bytes: int = 0
) -> list[list[int]]:
    """Tensor fusion: the positions in `sizes` (element counts, in packing order) of each bucket.

    A tensor joins the current bucket while the bucket stays within `bucket_bytes` at `itemsize`
    bytes a value (the first bucket within `first_bucket_bytes` unless 0); a larger tensor gets a
    bucket of its own; empty tensors are left out.
    """
    buckets: list[list[int]] = []
    current: list[int] = []
    used = 0  # Elements in `current`.
    limit = first_bucket_bytes or bucket_bytes
    for position, size in enumerate(sizes):
        if size == 0:
            continue
        if current and (used + size) * itemsize > limit:
            buckets.append(current)
            current, used, limit = [], 0, bucket_bytes
        current.append(position)
        used += size
    if current:
        buckets.append(current)
    return buckets


def reduces_hierarchically(strategy: str, nbytes: int, crossover_bytes: int) -> bool:
    """Whether `strategy` reduces a bucket of `nbytes` in the hierarchical stages. Jia et al.:
    the hierarchical all-reduce beats the flat ring for small messages (fewer latency-bound
    steps); for large ones the ring's bandwidth optimality wins (`hybrid` switches at
    `crossover_bytes`)."""
    return strategy == "hierarchical" or (strategy == "hybrid" and nbytes < crossover_bytes)
