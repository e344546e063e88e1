r"""How fast are BatchNorm's per-channel reductions, against the bandwidth the shape allows?

The step's profile puts a third of ResNet-50's kernel time in BatchNorm statistics and their
backward sums. For each of ResNet-50's BatchNorm shapes (NHWC, bf16) this times, as one jitted
call each:

  * `copy`: ``x * 2`` in bf16, a read and a write of the tensor: what a memory-bound pass of
    this shape gets (the yardstick);
  * `fwd`: the forward statistics, sum(x - K) and sum((x - K)^2) per channel in fp32 (K a
    sample of each channel, as `batch_norm_ops.moments`);
  * `bwd`: the backward's sums behind a ReLU, sum(dy) and sum(dy * (x - K)) with
    dy = where(y > 0, g, 0), reading g, y and x;

each as XLA compiles the plain jnp expression (`xla`), with the rows first summed in groups
(`xla_groups`: (G, M/G, C) summed over the middle axis, then over G), with k rows folded into
one row of k C columns (`xla_wide`: k C near 1024, then the k partial sums added), and as a
Pallas (Triton) kernel that sums blocks of rows into per-block partials (`pallas`). GB/s counts
the bytes read (and written, for `copy`) once.

  python -m scripts.bench.bn_reductions --batches=256,64 --out=/tmp/bn_reductions.json
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from jia_jax.crop_kernel import power_of_two_tile
from scripts.bench import harness

# ResNet-50 v1.5's BatchNorm inputs at 224 pixels: (spatial size, channels) and how many BNs
# of the net have that shape (stem; per stage: reduce, 3x3, expand, shortcut).
RESNET50_BN_SHAPES = (
    (112, 64, 1),
    (56, 64, 6),
    (56, 256, 4),
    (56, 128, 1),
    (28, 128, 7),
    (28, 512, 5),
    (28, 256, 1),
    (14, 256, 11),
    (14, 1024, 7),
    (14, 512, 1),
    (7, 512, 5),
    (7, 2048, 4),
)


def _rows(x: jax.Array) -> jax.Array:
    return x.reshape(-1, x.shape[-1])


def fwd_xla(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    x2 = _rows(x).astype(jnp.float32)
    d = x2 - x2[0]
    return jnp.sum(d, 0), jnp.sum(d * d, 0)


def bwd_xla(g: jax.Array, y: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    x2 = _rows(x).astype(jnp.float32)
    dy = jnp.where(_rows(y) > 0, _rows(g).astype(jnp.float32), 0.0)
    return jnp.sum(dy, 0), jnp.sum(dy * (x2 - x2[0]), 0)


def _groups(m: int) -> int:
    """The largest power of two <= 1024 dividing m with at least 64 rows per group."""
    g = 1
    while g < 1024 and m % (2 * g) == 0 and m // (2 * g) >= 64:
        g *= 2
    return g


def fwd_xla_groups(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    x2 = _rows(x).astype(jnp.float32)
    d = x2 - x2[0]
    m, c = d.shape
    d3 = d.reshape(_groups(m), -1, c)
    return jnp.sum(jnp.sum(d3, 1), 0), jnp.sum(jnp.sum(d3 * d3, 1), 0)


def bwd_xla_groups(g: jax.Array, y: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    x2 = _rows(x).astype(jnp.float32)
    dy = jnp.where(_rows(y) > 0, _rows(g).astype(jnp.float32), 0.0)
    m, c = x2.shape
    k = _groups(m)
    dy3, p3 = dy.reshape(k, -1, c), (dy * (x2 - x2[0])).reshape(k, -1, c)
    return jnp.sum(jnp.sum(dy3, 1), 0), jnp.sum(jnp.sum(p3, 1), 0)


def _widen(m: int, c: int) -> int:
    """Rows folded into one: the largest power of two k dividing m with k * c <= 1024."""
    k = 1
    while k * c < 1024 and m % (2 * k) == 0:
        k *= 2
    return k


def fwd_xla_wide(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    x2 = _rows(x).astype(jnp.float32)
    m, c = x2.shape
    k = _widen(m, c)
    d = x2.reshape(m // k, k * c) - jnp.tile(x2[0], k)
    return jnp.sum(d, 0).reshape(k, c).sum(0), jnp.sum(d * d, 0).reshape(k, c).sum(0)


def bwd_xla_wide(g: jax.Array, y: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    x2 = _rows(x).astype(jnp.float32)
    m, c = x2.shape
    k = _widen(m, c)
    dy = jnp.where(_rows(y) > 0, _rows(g).astype(jnp.float32), 0.0).reshape(m // k, k * c)
    p = dy * (x2.reshape(m // k, k * c) - jnp.tile(x2[0], k))
    return jnp.sum(dy, 0).reshape(k, c).sum(0), jnp.sum(p, 0).reshape(k, c).sum(0)


def _pallas_sums(
    body: Callable[..., tuple[jax.Array, jax.Array]],
    operands: Sequence[jax.Array],
    shift: jax.Array,
    block_rows: int,
    interpret: bool,
) -> tuple[jax.Array, jax.Array]:
    """Two per-channel sums of `body(*row blocks, shift)`: Pallas per-block partials, then XLA."""
    from jax.experimental import pallas as pl

    m, c = operands[0].shape
    bm, bc = power_of_two_tile(m, block_rows), min(c, 128)
    grid = (m // bm, c // bc)

    def kernel(*refs):
        *ins, shift_ref, s_ref, q_ref = refs
        s, q = body(*(r[...].astype(jnp.float32) for r in ins), shift_ref[...])
        s_ref[...] = jnp.sum(s, axis=0, keepdims=True)
        q_ref[...] = jnp.sum(q, axis=0, keepdims=True)

    block = pl.BlockSpec((bm, bc), lambda i, j: (i, j))
    row = pl.BlockSpec((1, bc), lambda i, j: (0, j))
    out = pl.BlockSpec((1, bc), lambda i, j: (i, j))
    partial = jax.ShapeDtypeStruct((grid[0], c), jnp.float32)
    s, q = pl.pallas_call(
        kernel,
        out_shape=(partial, partial),
        grid=grid,
        in_specs=[block] * len(operands) + [row],
        out_specs=(out, out),
        interpret=interpret,
    )(*operands, shift.reshape(1, c))
    return jnp.sum(s, 0), jnp.sum(q, 0)


def fwd_pallas(x: jax.Array, block_rows: int = 512, interpret: bool = False):
    x2 = _rows(x)

    def body(xb, k):
        d = xb - k
        return d, d * d

    return _pallas_sums(body, [x2], x2[0].astype(jnp.float32), block_rows, interpret)


def bwd_pallas(g, y, x, block_rows: int = 512, interpret: bool = False):
    x2 = _rows(x)

    def body(gb, yb, xb, k):
        dy = jnp.where(yb > 0, gb, 0.0)
        return dy, dy * (xb - k)

    ops = [_rows(g), _rows(y), x2]
    return _pallas_sums(body, ops, x2[0].astype(jnp.float32), block_rows, interpret)


VARIANTS = {
    "xla": (fwd_xla, bwd_xla),
    "xla_groups": (fwd_xla_groups, bwd_xla_groups),
    "xla_wide": (fwd_xla_wide, bwd_xla_wide),
    "pallas": (fwd_pallas, bwd_pallas),
}


def measure_shape(batch: int, size: int, channels: int, variants: Sequence[str]) -> list[dict]:
    """Rows of GB/s for one BatchNorm shape: the copy yardstick, then each variant's sums."""
    shape = (batch, size, size, channels)
    keys = jax.random.split(jax.random.key(0), 3)
    x, g, y = (jax.random.normal(k, shape, jnp.bfloat16) for k in keys)
    nbytes = x.size * x.dtype.itemsize
    base = {"batch": batch, "size": size, "channels": channels}
    rows = []

    def timed(name: str, fn, arg, moved: int) -> None:
        try:
            t = harness.time_calls(jax.jit(fn), arg, repeats=5, min_sample_s=0.02)["time_s"]
            rows.append({**base, "op": name, "us": t * 1e6, "gb_per_s": moved / t / 1e9})
        except Exception as e:  # pylint: disable=broad-except
            rows.append({**base, "op": name, "error": harness.error_text(e, 400)})
        print(rows[-1], flush=True)

    timed("copy", lambda a: a * 2, x, 2 * nbytes)
    for v in variants:
        fwd, bwd = VARIANTS[v]
        timed(f"fwd:{v}", fwd, x, nbytes)
        timed(f"bwd:{v}", lambda a, bwd=bwd: bwd(*a), (g, y, x), 3 * nbytes)
    return rows


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="256,64")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--out", default="bn_reductions.json")
    args = parser.parse_args(argv)
    doc: dict[str, Any] = {"environment": harness.environment(), "args": vars(args)}
    rows: list[dict] = []
    for batch in (int(b) for b in args.batches.split(",")):
        for size, channels, _ in RESNET50_BN_SHAPES:
            rows += measure_shape(batch, size, channels, args.variants.split(","))
            doc["results"] = rows
            harness.write_json(args.out, doc)
    return doc


if __name__ == "__main__":
    main()
