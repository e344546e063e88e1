"""The mean of a gradient bucket over devices with fp8 on the wire: half the bytes of bfloat16.

Across a slow network the gradient bytes set the step's floor once backward can hide no more of
them (docs/benchmarks.md, "Across hosts"). Sending each bucket in 8 bits halves them, as FP8-LM
does for its gradients' all-reduce (Peng et al. 2023, "FP8-LM: Training FP8 Large Language
Models"). NCCL's all-reduce would add the 8-bit values in 8 bits, so the sum is written as the two
halves of a ring all-reduce, each moving 8-bit values with their scales:

1. all-to-all: each device cuts its bucket into one chunk per device, scales each chunk into
   float8_e4m3fn's range (its largest magnitude becomes 448) and sends chunk k, its scale in
   4 bytes after it, to device k; device k adds the n chunks it receives in fp32 and divides.
2. all-gather: each device scales its chunk of the mean into fp8 the same way and every device
   gathers all of them.

Each device sends 2 (n - 1) / n bytes per element of the bucket, what a ring all-reduce sends per
element in a 1-byte dtype. Every element is rounded twice to e4m3's 3 significant bits: each time
off by at most 2^-4 of itself or, among fp8's subnormals, 2^-10 of its chunk's scale (half their
spacing), whichever is larger. Between two devices (e.g. the two nodes of the hierarchical form) one
all-gather of the scaled chunks sends the same byte per element in one collective instead of two
(over a socket network each has a fixed cost of its own), and each device adds both buckets in fp32,
the same two terms on both: every element is rounded once. A non-finite gradient makes its chunk's
scale non-finite, hence that chunk of the mean NaN on every device, as the finite check of loss
scaling needs (jia_jax/precision.py). The all-reduce strategies call it over every device (flat) or
across nodes only (hierarchical: jia_jax/allreduce.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jia_jax import bucketing

DTYPE = jnp.dtype(bucketing.FP8_WIRE)
NOT_BY_XLA = (
    f"comm.dtype={bucketing.FP8_WIRE!r} needs one of the explicit comm.strategy values (flat, "
    "hierarchical, hybrid or auto): XLA's own all-reduce would sum in fp8 (jia_jax/fp8_wire.py)."
)
# The largest finite float8_e4m3fn; a chunk's largest magnitude is scaled to it.
_MAX = float(jnp.finfo(DTYPE).max)
_SCALE_BYTES = 4  # an fp32 scale, sent as bytes after its chunk


def mean(bucket: jax.Array, axes: str | tuple[str, ...]) -> jax.Array:
    """The mean of the 1-D `bucket` over the devices of the mesh `axes`, in fp32, identical on
    every device; the bucket crosses the wire as fp8 with a scale per chunk (module docstring).

    Call inside a `jax.shard_map` in which `axes` are manual.
    """
    devices = jax.lax.axis_size(axes)
    size = bucket.shape[0]
    chunk = -(-size // devices)
    padded = jnp.pad(bucket, (0, chunk * devices - size))
    rows = encode(padded.reshape(devices, chunk))
    if devices == 2:
        # Both devices' buckets, device 0's first: [2 x 2 chunks, chunk]; their fp32 sum.
        gathered = decode(jax.lax.all_gather(rows, axes, axis=0, tiled=True))
        return (jnp.sum(gathered.reshape(devices, -1), axis=0) / devices)[:size]
    received = jax.lax.all_to_all(rows, axes, 0, 0, tiled=True)
    part = jnp.sum(decode(received), axis=0) / devices
    gathered = jax.lax.all_gather(encode(part[None]), axes, axis=0, tiled=True)
    return decode(gathered).reshape(-1)[:size]


def encode(rows: jax.Array) -> jax.Array:
    """uint8 [r, m + 4]: each row of `rows` [r, m] in fp8, scaled so that its largest magnitude
    is fp8's largest, then its fp32 scale (1 for a row of zeros)."""
    rows = rows.astype(jnp.float32)
    largest = jnp.max(jnp.abs(rows), axis=1, keepdims=True)
    scale = jnp.where(largest > 0, largest / _MAX, 1.0)
    values = jax.lax.bitcast_convert_type((rows / scale).astype(DTYPE), jnp.uint8)
    scale_bytes = jax.lax.bitcast_convert_type(scale[:, 0], jnp.uint8)  # [r, 4]
    return jnp.concatenate([values, scale_bytes], axis=1)


def decode(encoded: jax.Array) -> jax.Array:
    """fp32 [r, m]: the rows `encode` made [r, m + 4], times their scales."""
    values = jax.lax.bitcast_convert_type(encoded[:, :-_SCALE_BYTES], DTYPE)
    scale = jax.lax.bitcast_convert_type(encoded[:, -_SCALE_BYTES:], jnp.float32)
    return values.astype(jnp.float32) * scale[:, None]
