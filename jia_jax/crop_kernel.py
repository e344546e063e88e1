"""The crop's two products as Pallas (Triton) kernels that read only each tile's window.

`crop_resize.resize_tiles` is two matrix products per tile: the vertical one contracts the
tile's rows with its [out, canvas] weights, the horizontal one the intermediate's columns with
the other axis' weights. A weight row (one output sample) is zero outside the filter's support
around the sample's centre (and outside its image), so a block of output samples needs only the
band of rows or columns under its samples' supports, a part of the crop's window, itself a part
of the tile. XLA's products read and multiply all `canvas` rows and columns of every tile, after
converting the whole uint8 tile to bfloat16 in a pass of its own. These kernels loop, per block
of output samples, over only the blocks of the contraction that meet its band, convert the
uint8 pixels as they load them, and compute each block of weights from its rows' four taps
(jia_jax/resize_filter.py) instead of reading it: XLA spent about 90 us a batch of 256 on an
H200 writing the dense weights, 98% zeros, that the kernels then read, and the crop program's
kernels now take 270 against 362 us (docs/benchmarks/gpu_decode_crop_taps_1xH200.json). Same
arithmetic: bfloat16 operands, float32 accumulation, in another order.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jia_jax import resize_filter


class Blocks(NamedTuple):
    """A kernel's tiling: output rows and columns, contraction, warps and pipeline stages
    (upper bounds for the block sizes: each is the largest power of two dividing its axis).
    Blocks of 64 output samples (n) follow the filter's band more closely than 128: on an H200
    the two kernels took 242 against 256 us a batch of 256 ImageNet crops, 63 against 65 at 64
    (docs/benchmarks/gpu_decode_crop_band_1xH200.json)."""

    m: int = 128
    n: int = 64
    k: int = 32
    warps: int = 4
    stages: int = 3


def power_of_two_tile(extent: int, limit: int) -> int:
    """The largest power of two <= limit dividing extent (a Pallas block's size on an axis)."""
    size = 1
    while 2 * size <= limit and extent % (2 * size) == 0:
        size *= 2
    return size


def _blocks_meeting(pixels: jax.Array, block: int) -> jax.Array:
    """int32 [..., 2]: the first block of `block` positions meeting each range [low, high) of
    `pixels` [..., 2], and one past the last (an empty range gives an empty one)."""
    return jnp.stack([pixels[..., 0] // block, -(-pixels[..., 1] // block)], axis=-1)


def padded(size: int) -> int:
    """`size` rounded up to a power of two, the kernels' output width (Triton's blocks are)."""
    return 1 << max(0, size - 1).bit_length()


def unsupported(canvas: int, image_size: int) -> str | None:
    """Why the kernels cannot crop tiles of `canvas` to `image_size` on a GPU (Triton's products
    take blocks of at least 16 along each axis), or None."""
    if canvas % 16:
        return f"a canvas that is a multiple of 16 (data.gpu_canvas={canvas})"
    if image_size < 9:
        return f"an image size of at least 9 (data.image_size={image_size})"
    return None


def row_spans(taps: jax.Array, count: int) -> jax.Array:
    """int32 [T, rows, 2]: per tile and row of `taps` [T, NUM_TAPS, rows] (resize_filter), a
    range [low, high) of pixels 0..count-1 holding every nonzero weight of the row, clipped to
    the image; empty (low >= high) for a row of scale 0 (no sample) and for a tile with no
    image (valid 0).

    A row's weights are nonzero only within the filter's support of its centre; a pixel more on
    each side covers the centres' float32 rounding."""
    centre, support, valid, scale = (taps[:, q] for q in range(resize_filter.NUM_TAPS))
    stop = jnp.minimum(valid, count)
    low = jnp.clip(jnp.floor(centre - support - 1.0), 0, stop)
    high = jnp.clip(jnp.ceil(centre + support + 1.0), 0, stop)
    empty = scale == 0
    return jnp.stack([jnp.where(empty, count, low), jnp.where(empty, 0, high)],
                     axis=-1).astype(jnp.int32)


def to_pixels(sums: jax.Array) -> jax.Array:
    """uint8: float32 `sums` rounded to the nearest integer, ties to even (as `jnp.round`),
    clipped to [0, 255]. By `floor`, which Triton lowers (it lowers no `round`): floor(x + 0.5)
    is exact for |x| < 2**22, a tie (x + 0.5 an integer) then goes down to the even one."""
    nearest = jnp.floor(sums + 0.5)
    odd_tie = (nearest - sums == 0.5) & (jnp.floor(nearest * 0.5) * 2 != nearest)
    return jnp.clip(jnp.where(odd_tie, nearest - 1, nearest), 0, 255).astype(jnp.uint8)


def hull(spans: jax.Array) -> jax.Array:
    """int32 [..., 2]: the smallest range holding every range of `spans` [..., rows, 2] (empty
    where all are: low >= high)."""
    return jnp.stack([spans[..., 0].min(-1), spans[..., 1].max(-1)], axis=-1)


def windowed_product(
    a: jax.Array,
    taps: jax.Array,
    *,
    dtype: jnp.dtype,
    out_dtype: jnp.dtype,
    wanted: jax.Array | None = None,
    blocks: Blocks = Blocks(),
    interpret: bool = False,
) -> jax.Array:
    """out[t, m, n] = sum over k of a[t, k, m] * w[t, n, k], [T, M, N], w the weights of `taps`
    (`resize_filter.triangle` of pixel k for row n) rounded to `dtype`, computed per block as
    they are multiplied: no dense weight matrix is written or read.

    Args:
      a: [T, K, M], uint8 or `dtype` (converted to it as loaded).
      taps: float32 [T, NUM_TAPS, N], N a power of two: for each block of rows n the kernel
        sums the blocks of k that meet the hull of their `row_spans`.
      dtype: the products' operands' dtype (float32 accumulation).
      out_dtype: the output's dtype (the sums rounded to it); uint8: the sums as pixels
        (`to_pixels`), so that no float32 output is written and read again to round it.
      wanted: int32 [T, 2], the range of m wanted of each tile: the blocks of m that miss it
        are neither computed nor written (their memory is left as it was: nothing may read
        it), all of m where None.
      blocks: the tiling.
      interpret: run the kernel in Pallas' interpreter (CPU tests).
    """
    from jax.experimental import pallas as pl  # noqa: PLC0415 - only where the kernels run
    from jax.experimental.pallas import triton as plgpu  # noqa: PLC0415

    t, k, m = a.shape
    n = taps.shape[-1]
    bm, bn, bk = (power_of_two_tile(m, blocks.m), power_of_two_tile(n, blocks.n),
                  power_of_two_tile(k, blocks.k))
    wanted = jnp.tile(jnp.array([0, m], jnp.int32), (t, 1)) if wanted is None else wanted
    spans = row_spans(taps, k).reshape(t, n // bn, bn, 2)
    bands = _blocks_meeting(hull(spans), bk)  # [T, N / bn, 2]
    steps = jnp.concatenate([bands, jnp.broadcast_to(wanted[:, None], bands.shape)], axis=-1)

    def kernel(steps_ref, taps_ref, a_ref, out_ref):
        first = pl.program_id(1) * bm
        needed = (first < steps_ref[3]) & (first + bm > steps_ref[2])
        row_taps = [taps_ref[q, :][:, None] for q in range(resize_filter.NUM_TAPS)]  # [bn, 1]

        def step(block, acc):
            ks = pl.ds(block * bk, bk)
            pixel = block * bk + jax.lax.broadcasted_iota(jnp.int32, (1, bk), 1)
            weights = resize_filter.triangle(pixel, *row_taps).astype(dtype)  # [bn, bk]
            lhs = a_ref[ks, :].astype(dtype)
            return acc + jax.lax.dot_general(lhs, weights, (((0,), (1,)), ((), ())),
                                             preferred_element_type=jnp.float32)

        @pl.when(needed)
        def _():
            sums = jax.lax.fori_loop(steps_ref[0], steps_ref[1], step,
                                     jnp.zeros((bm, bn), jnp.float32))
            out_ref[...] = (to_pixels(sums) if out_ref.dtype == jnp.uint8
                            else sums.astype(out_ref.dtype))

    params = None if interpret else plgpu.CompilerParams(num_warps=blocks.warps,
                                                         num_stages=blocks.stages)
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((t, m, n), out_dtype),
        grid=(t, m // bm, n // bn),
        in_specs=[pl.BlockSpec((None, None, 4), lambda i, j, l: (i, l, 0)),
                  pl.BlockSpec((None, resize_filter.NUM_TAPS, bn), lambda i, j, l: (i, 0, l)),
                  pl.BlockSpec((None, k, bm), lambda i, j, l: (i, 0, j))],
        out_specs=pl.BlockSpec((None, bm, bn), lambda i, j, l: (i, j, l)),
        compiler_params=params,
        interpret=interpret,
    )(steps.astype(jnp.int32), taps, a)


def resize_products(
    tiles: jax.Array,
    taps_y: jax.Array,
    taps_x: jax.Array,
    *,
    image_size: int,
    dtype: jnp.dtype = jnp.bfloat16,
    as_pixels: bool = False,
    interpret: bool = False,
) -> jax.Array:
    """float32 [T, image_size, image_size, 3]: each tile's `Wy @ tile @ Wx^T` per channel, as
    `crop_resize.resize_tiles`' XLA products compute it (weights and intermediate rounded to
    `dtype`); with `as_pixels`, uint8: those sums as `to_pixels`.

    Args:
      tiles: uint8 [T, canvas, canvas, 3].
      taps_y, taps_x: float32 [T, NUM_TAPS, padded(image_size)], the normalised taps per axis
        (`crop_resize.normalised_taps`), rows past `image_size` of scale 0.
      image_size: output height and width.
      dtype: the products' operands' dtype.
      as_pixels: round and clip the sums in the horizontal kernel, which then writes a quarter
        of the bytes, leaving no float32 output for a pass of XLA's to read again and round.
      interpret: run the kernels in Pallas' interpreter (CPU tests).
    """
    t, canvas, _, channels = tiles.shape
    # Vertical: contract the rows h of [T, h, w c]; the intermediate is [T, w c, s], computed
    # and written only for the columns w the horizontal product reads (its blocks meeting their
    # spans' hull, a superset of each of its row blocks' bands with the same blocks of k).
    blocks = Blocks()
    block = power_of_two_tile(canvas, blocks.k)
    read = _blocks_meeting(hull(row_spans(taps_x, canvas)), block) * block * channels
    inner = windowed_product(tiles.reshape(t, canvas, canvas * channels), taps_y, wanted=read,
                             dtype=dtype, out_dtype=dtype, blocks=blocks, interpret=interpret)
    # Horizontal: contract the columns w of [T, w, c s]; the output is [T, c s, k].
    s = inner.shape[-1]
    out = windowed_product(inner.reshape(t, canvas, channels * s), taps_x, dtype=dtype,
                           out_dtype=jnp.uint8 if as_pixels else jnp.float32, blocks=blocks,
                           interpret=interpret)
    out = out.reshape(t, channels, s, -1)[:, :, :image_size, :image_size]
    return out.transpose(0, 2, 3, 1)
