r"""Does a 1x1 convolution computing its BatchNorm statistics beat XLA's two passes?

Training BatchNorm after a convolution reads the convolution's output y once more for its
per-channel mean and variance. A 1x1 convolution is a matrix product, [M, K] @ [K, N] with
M = images x height x width, so a Pallas (Triton) matrix product can compute the statistics from
each output tile while it is still in registers and never read y again. Each tile of BM rows
gives its channels' mean and sum of squared deviations from that mean (exact in fp32 for the
tile), and the tiles are combined by Chan, Golub & LeVeque's pairwise formula: no cancellation,
as accurate as the shifted sums of `jia_jax.models.batch_norm_ops.moments`.

For each of ResNet-50's 1x1 convolution shapes (bf16, fp32 accumulation) this times, as one jitted
call each:

  * `xla`: `jnp.dot` then `moments` on its bf16 output (what the trainer's step compiles to);
  * `xla_gemm`: the product alone;
  * `xla_input_stats`: the product, and the statistics from x's covariance (see there);
  * `pallas`: the product with the statistics in its epilogue;
  * `pallas_shifted`: the same, the tile's two sums independent of each other (see `stats`);
  * `pallas_gemm`: the same kernel without them (how fast the Pallas product itself is);
  * `pallas@BMxBNxBKxWARPSxSTAGES` (either Pallas variant): another tiling of the kernel.

  python -m scripts.bench.conv_stats --batches=256,64 --out=/tmp/conv_stats.json
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from jia_jax import crop_kernel
from jia_jax.models import batch_norm_ops
from scripts.bench import harness

# ResNet-50 v1.5's 1x1 convolutions at 224 pixels: (spatial size, in channels, out channels).
RESNET50_1X1_SHAPES = (
    (56, 64, 256),
    (56, 256, 64),
    (56, 256, 128),
    (28, 128, 512),
    (28, 512, 128),
    (14, 256, 1024),
    (14, 1024, 256),
    (7, 512, 2048),
    (7, 2048, 512),
)


def xla_conv_stats(x: jax.Array, w: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """y = x @ w in bf16 (fp32 accumulation), and its per-channel mean and biased variance."""
    y = xla_gemm(x, w)
    mean, var = batch_norm_ops.moments(y)
    return y, mean, var


def xla_gemm(x: jax.Array, w: jax.Array) -> jax.Array:
    """y = x @ w in bf16 (fp32 accumulation)."""
    return jnp.dot(x, w, preferred_element_type=jnp.float32).astype(x.dtype)


def xla_input_stats(x: jax.Array, w: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """y = x @ w, with y's per-channel mean and biased variance from x instead of from y.

    The product is linear per row, so mean(y) = mean(x) @ w and var(y) = diag(w^T C w) with
    C = x^T x / M - mean(x) mean(x)^T, x's [K, K] covariance over its M rows: one product that
    reads x's K columns where `moments` reads y's N, a quarter of the bytes where ResNet's
    bottleneck widens K to N = 4K. The statistics are the exact product's, in fp32.
    """
    y = xla_gemm(x, w)
    f32 = jnp.float32
    mean_x = jnp.sum(x.astype(f32), 0) / x.shape[0]
    gram = jax.lax.dot_general(x, x, (((0,), (0,)), ((), ())), preferred_element_type=f32)
    cov = gram / x.shape[0] - jnp.outer(mean_x, mean_x)
    w32 = w.astype(f32)
    return y, mean_x @ w32, jnp.maximum(jnp.sum(w32 * (cov @ w32), 0), 0.0)


def combine(means: jax.Array, squares: jax.Array, rows: int) -> tuple[jax.Array, jax.Array]:
    """Mean and biased variance of all rows from tiles of `rows` rows each: per tile its mean and
    sum of squared deviations (float32 [tiles, N]); Chan et al.'s pairwise combination."""
    mean = jnp.mean(means, axis=0)
    spread = jnp.sum(squares, axis=0) + rows * jnp.sum((means - mean) ** 2, axis=0)
    return mean, spread / (rows * means.shape[0])


def pallas_conv_stats(
    x: jax.Array,
    w: jax.Array,
    *,
    stats: str | None = "two_pass",
    block_m: int = 128,
    block_n: int = 128,
    block_k: int = 64,
    num_warps: int = 4,
    num_stages: int = 3,
    interpret: bool = False,
):
    """`xla_conv_stats` (or, `stats=None`, `xla_gemm`) as one Pallas kernel per output tile.

    stats: how a tile's statistics are taken: `two_pass`, its mean then the squared deviations
      from it (the second sum waits for the first); `shifted`, sums of y - K and (y - K)^2 with K
      the tile's first row, two independent sums (the tile's mean is K + sum / rows and its
      squared deviations sum((y - K)^2) - sum(y - K)^2 / rows, as in `moments`).
    """
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    if stats not in ("two_pass", "shifted", None):
        raise ValueError(f"stats={stats!r}: two_pass, shifted or None")
    (m, k), n = x.shape, w.shape[1]
    tile = crop_kernel.power_of_two_tile
    bm, bn, bk = tile(m, block_m), tile(n, block_n), tile(k, block_k)
    grid = (m // bm, n // bn)

    def kernel(x_ref, w_ref, y_ref, *stat_refs):
        def step(i, acc):
            cols = pl.ds(i * bk, bk)
            return acc + jnp.dot(x_ref[:, cols], w_ref[cols, :],
                                 preferred_element_type=jnp.float32)

        acc = jax.lax.fori_loop(0, k // bk, step, jnp.zeros((bm, bn), jnp.float32))
        y = acc.astype(y_ref.dtype)
        y_ref[...] = y
        yf = y.astype(jnp.float32)  # the statistics of the bf16 y, as BatchNorm reads it
        if stats == "two_pass":
            mean = jnp.sum(yf, axis=0, keepdims=True) / bm
            stat_refs[0][...] = mean
            stat_refs[1][...] = jnp.sum((yf - mean) ** 2, axis=0, keepdims=True)
        elif stats == "shifted":
            # The shift read back from the tile just stored: Pallas' Triton lowering has no
            # slice of a value (measured: NotImplementedError on an H200), only of a ref.
            shift = y_ref[pl.ds(0, 1), :].astype(jnp.float32)
            d = yf - shift
            total = jnp.sum(d, axis=0, keepdims=True)
            stat_refs[0][...] = shift + total / bm
            squares = jnp.sum(d * d, axis=0, keepdims=True) - total * total / bm
            stat_refs[1][...] = jnp.maximum(squares, 0.0)

    tile_stats = pl.BlockSpec((1, bn), lambda i, j: (i, j))
    partial = jax.ShapeDtypeStruct((grid[0], n), jnp.float32)
    out = pl.pallas_call(
        kernel,
        out_shape=(jax.ShapeDtypeStruct((m, n), x.dtype), *([partial] * 2 * bool(stats))),
        grid=grid,
        in_specs=[pl.BlockSpec((bm, k), lambda i, j: (i, 0)),
                  pl.BlockSpec((k, bn), lambda i, j: (0, j))],
        out_specs=(pl.BlockSpec((bm, bn), lambda i, j: (i, j)), *([tile_stats] * 2 * bool(stats))),
        compiler_params=None if interpret else plgpu.CompilerParams(num_warps, num_stages),
        interpret=interpret,
    )(x, w)
    if not stats:
        return out[0]
    y, means, squares = out
    return (y, *combine(means, squares, bm))


VARIANTS = {
    "xla": xla_conv_stats,
    "xla_gemm": xla_gemm,
    "xla_input_stats": xla_input_stats,
    "pallas": pallas_conv_stats,
    "pallas_shifted": functools.partial(pallas_conv_stats, stats="shifted"),
    "pallas_gemm": functools.partial(pallas_conv_stats, stats=None),
}


def variant(name: str) -> Callable[[jax.Array, jax.Array], Any]:
    """A variant by name; a Pallas one may name its tiling after an `@`:
    `pallas@BMxBNxBKxWARPSxSTAGES` (e.g. `pallas@256x128x64x8x3`)."""
    base, _, tiling = name.partition("@")
    if not tiling:
        return VARIANTS[name]
    if not base.startswith("pallas"):
        raise ValueError(f"{name}: only the Pallas variants take a tiling")
    keys = ("block_m", "block_n", "block_k", "num_warps", "num_stages")
    values = [int(v) for v in tiling.split("x")]
    if len(values) != len(keys):
        raise ValueError(f"{name}: a tiling is BMxBNxBKxWARPSxSTAGES")
    return functools.partial(VARIANTS[base], **dict(zip(keys, values)))


def measure_shape(batch: int, size: int, k: int, n: int, variants: Sequence[str]) -> list[dict]:
    """Rows of µs and GB/s (x, w and y moved once) for one shape, one per variant."""
    m = batch * size * size
    kx, kw = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, (m, k), jnp.bfloat16)
    w = (jax.random.normal(kw, (k, n)) / k**0.5).astype(jnp.bfloat16)
    moved = 2 * (m * k + k * n + m * n)
    base = {"batch": batch, "size": size, "in_channels": k, "out_channels": n}
    rows = []
    for name in variants:
        try:
            fn = jax.jit(lambda operands, f=variant(name): f(*operands))
            t = harness.time_calls(fn, (x, w), repeats=5, min_sample_s=0.02)["time_s"]
            rows.append({**base, "variant": name, "us": t * 1e6, "gb_per_s": moved / t / 1e9})
        except Exception as e:  # noqa: BLE001 - a kernel this GPU or Triton refuses
            rows.append({**base, "variant": name, "error": harness.error_text(e, 400)})
        print(rows[-1], flush=True)
    return rows


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="256,64")
    parser.add_argument(
        "--variants", default=",".join(VARIANTS),
        help="comma-separated; a Pallas variant may add its tiling, e.g. pallas@256x128x64x8x3",
    )
    parser.add_argument("--out", default="conv_stats.json")
    args = parser.parse_args(argv)
    doc: dict[str, Any] = {"environment": harness.environment(), "args": vars(args), "results": []}
    for batch in (int(b) for b in args.batches.split(",")):
        for size, k, n in RESNET50_1X1_SHAPES:
            doc["results"] += measure_shape(batch, size, k, n, args.variants.split(","))
            harness.write_json(args.out, doc)
    return doc


if __name__ == "__main__":
    main()
