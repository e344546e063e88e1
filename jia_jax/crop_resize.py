"""Crop and resize on the device, from decoded tiles: Pillow's bilinear resize, in JAX.

The GPU input path (jia_jax/gpu_input.py) has the JPEG decoder write each image into square
tiles of `canvas` pixels, slots of one uint8 [T, canvas, canvas, 3] array. An image that fits in
one canvas (a 512 canvas holds every ImageNet-sized, 500 x 375, image) is decoded whole into one
tile, at its top-left corner. A larger one takes a grid of tiles over its crop's window (plus the
filter's reach around it): each holds the image's pixels from the tile's origin to the image's
edge or the tile's, a region of interest inside the image. What a tile holds past the image's
edge is never read (its weights are 0, `valid` below). Every tile has the same shape, so one
program of fixed shape resizes a whole batch, for any mix of image and crop sizes: the plan
(`plan_tiles`, on the host) says where each tile sits, and the resize's scale and translation are
traced values, not shapes.

The resize is the one Pillow's `Image.resize(size, BILINEAR, box=box)` computes (the CPU path):
a triangle filter whose support widens with the downscale factor (antialiasing), over the
image's pixels only, each output pixel's weights normalised to sum to 1. Per axis it is an
[out, canvas] weight matrix (jia_jax/resize_filter.py), scaled beforehand so that an example's
weights sum to 1 over all its tiles (`normalised_taps`); a tile contributes `Wy @ tile @ Wx^T`,
and an example's tiles are summed (nothing to sum where each example has one tile, the common
case: that program skips it). Pixels past the image's edge get weight 0, so the filter is
renormalised at the image's borders exactly as Pillow's is. `jax.image.
scale_and_translate` computes the same filter but normalises over the whole array it is given,
padding included, so it is used only as a cross-check where a tile holds nothing but image
(tests/test_crop_resize.py).

Arithmetic: the weights and the pixels are bfloat16, products accumulate in float32 (tensor
cores on a GPU; the CPU computes the same products). Per output pixel in 0..255 this costs at
most 3 x 2^-8 x 255 < 3 levels against exact arithmetic: the relative rounding (bfloat16's unit
roundoff, 2^-8: 8 significant bits) of the normalised vertical weights, of the intermediate
rows, and of the horizontal weights, each on values of at most 255 with weights summing to 1
(the uint8 pixels are exact in bfloat16). Pillow itself rounds the intermediate rows to uint8
(at most 0.5 level) and its output (0.5), so after rounding both to uint8 (0.5 more) the two
paths differ by at most 4 levels.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jia_jax import crop_kernel, resize_filter

# `resize_tiles`' products (`data.gpu_crop_kernel`): XLA's over whole tiles, or the Pallas
# kernels of jia_jax/crop_kernel.py.
KERNELS = ("xla", "pallas")
# The default: the same crops in less GPU time, and on one H200 it trained as fast as XLA's
# products or faster at 64 and 256 images per GPU (docs/input_pipeline.md, "How fast it is").
DEFAULT_KERNEL = "pallas"
# Where each tile's resize parameters sit in a plan row.
Y_START, Y_LENGTH, Y_VALID, X_START, X_LENGTH, X_VALID, FLIP = range(7)
NUM_PARAMS = 7
# A batch's tile count is padded up to a multiple of this fraction of the batch, so that a few
# compiled programs serve every mix of large and small crops.
_TILE_BUCKETS_PER_BATCH = 4


class TilePlan(NamedTuple):
    """Where each tile of a batch sits.

    example: int32 [T], the example each tile belongs to (the batch size for padding tiles,
      whose contribution is dropped).
    region: int64 [T, 4], (top, left, bottom, right): the pixels of its image the tile holds at
      its top-left corner, from the tile's origin (top, left) to the image's edge or the
      tile's; (0, 0, 0, 0) for padding tiles.
    params: float32 [T, NUM_PARAMS], per axis the crop's start relative to the tile's origin,
      the crop's length and the image's extent from the tile's origin (pixels past it are
      not read); then 1 where the example is flipped horizontally.
    """

    example: np.ndarray
    region: np.ndarray
    params: np.ndarray


def _support(length: np.ndarray, out_size: int) -> np.ndarray:
    """Reach of the filter on either side of a sample, in source pixels: 1 when upscaling, the
    scale factor when downscaling (Pillow's bilinear support times its filter scale)."""
    return np.maximum(length / out_size, 1.0)


def _span(start: np.ndarray, stop: np.ndarray, extent: np.ndarray, out_size: int):
    """The source rows (or columns) a crop's resize reads: its window widened by the filter's
    reach, clipped to the image."""
    reach = _support(stop - start, out_size)
    low = np.clip(np.floor(start - reach), 0, extent).astype(np.int64)
    high = np.clip(np.ceil(stop + reach), 0, extent).astype(np.int64)
    return low, high


def plan_tiles(
    boxes: np.ndarray,
    sizes: np.ndarray,
    flips: np.ndarray,
    has_image: np.ndarray,
    image_size: int,
    canvas: int,
) -> TilePlan:
    """The tiles that cover each example's crop: the whole image in one tile at (0, 0) where it
    fits in a canvas, else a grid of tiles over the crop's window and the filter's reach.

    Args:
      boxes: float [B, 4], (left, top, right, bottom) of each crop in source pixels.
      sizes: int [B, 2], (width, height) of each source image.
      flips: bool [B], flip the output horizontally.
      has_image: bool [B], False for examples without an image (eval padding, a record left
        out): they get no tile, and their output is zeros.
      image_size: output height and width.
      canvas: side of a tile.

    Returns:
      The plan, tiles of one example consecutive, row-major over its grid.
    """
    boxes = np.asarray(boxes, np.float64)
    width, height = np.asarray(sizes, np.int64).T
    y_low, y_high = _span(boxes[:, 1], boxes[:, 3], height, image_size)
    x_low, x_high = _span(boxes[:, 0], boxes[:, 2], width, image_size)
    # An image within one canvas is decoded whole (the hardware JPEG decoder takes no region of
    # interest): its one tile starts at its top-left corner.
    fits = (height <= canvas) & (width <= canvas)
    y_low, x_low = np.where(fits, 0, y_low), np.where(fits, 0, x_low)
    rows = -(-(y_high - y_low) // canvas)
    cols = -(-(x_high - x_low) // canvas)
    counts = np.where(has_image, rows * cols, 0)
    example = np.repeat(np.arange(len(counts), dtype=np.int32), counts)
    within = np.arange(len(example)) - np.repeat(np.cumsum(counts) - counts, counts)
    origin_y = y_low[example] + within // cols[example] * canvas
    origin_x = x_low[example] + within % cols[example] * canvas
    region = np.stack(
        [
            origin_y,
            origin_x,
            np.minimum(origin_y + canvas, height[example]),
            np.minimum(origin_x + canvas, width[example]),
        ],
        axis=1,
    )
    box = boxes[example]
    params = np.stack(
        [
            box[:, 1] - origin_y,
            box[:, 3] - box[:, 1],
            height[example] - origin_y,
            box[:, 0] - origin_x,
            box[:, 2] - box[:, 0],
            width[example] - origin_x,
            np.asarray(flips, np.float64)[example],
        ],
        axis=1,
    ).astype(np.float32)
    return TilePlan(example, region, params)


def padded_count(num_tiles: int, batch: int) -> int:
    """`num_tiles` rounded up to a multiple of a quarter of the batch (at least one tile)."""
    step = max(1, batch // _TILE_BUCKETS_PER_BATCH)
    return max(step, -(-num_tiles // step) * step)


def pad_plan(plan: TilePlan, count: int, batch: int) -> TilePlan:
    """`plan` with padding tiles up to `count`; they belong to example `batch` (dropped)."""
    extra = count - len(plan.example)
    return TilePlan(
        np.concatenate([plan.example, np.full(extra, batch, np.int32)]),
        np.concatenate([plan.region, np.zeros((extra, 4), np.int64)]),
        np.concatenate([plan.params, np.zeros((extra, NUM_PARAMS), np.float32)]),
    )


def normalisers(
    sy: jax.Array, sx: jax.Array, example: jax.Array, batch: int, one_tile_each: bool
) -> tuple[jax.Array, jax.Array]:
    """Per-axis factors [T, out] for each tile's weights, given their row sums `sy` and `sx`
    [T, out], such that summing each example's tiles' `Wy @ tile @ Wx^T` gives its normalised
    resize, with no division after the products.

    An example's weight at output (s, k), summed over its grid of R x C tiles, is
    (sum over its tile rows of wy's row sums) x (sum over its tile columns of wx's): the grid
    splits each axis into disjoint ranges, and a tile's wy depends on its grid row only, its wx
    on its grid column. Summed over all n = R x C tiles, wy's row sums give C times the first
    factor (SY) and wx's R times the second (SX), so the normaliser is SY x SX / n: scaling each
    tile's wy by n / SY and its wx by 1 / SX normalises the sum. Examples without a tile need
    nothing; padding tiles (example `batch`) are dropped later.
    """
    if one_tile_each:
        total_y, total_x, tiles = sy, sx, 1.0
    else:
        segments = functools.partial(
            jax.ops.segment_sum, segment_ids=example, num_segments=batch + 1,
            indices_are_sorted=True,
        )
        tiles = segments(jnp.ones_like(sy[:, :1]))[example]
        total_y, total_x = segments(sy)[example], segments(sx)[example]
    return (tiles / jnp.where(total_y > 0, total_y, 1.0),
            1.0 / jnp.where(total_x > 0, total_x, 1.0))


def normalised_taps(
    params: jax.Array, example: jax.Array, *, batch: int, image_size: int, canvas: int,
    rows: int, one_tile_each: bool,
) -> tuple[jax.Array, jax.Array]:
    """float32 [T, NUM_TAPS, rows] per axis (y, then x flipped where asked): each tile's
    `resize_filter` taps, their scales normalising the sum of an example's tiles
    (`normalisers`), rows past `image_size` of scale 0."""
    taps_y = resize_filter.axis_taps(params[:, Y_START], params[:, Y_LENGTH], params[:, Y_VALID],
                                     image_size, rows)
    taps_x = resize_filter.axis_taps(params[:, X_START], params[:, X_LENGTH], params[:, X_VALID],
                                     image_size, rows, flip=params[:, FLIP] > 0.5)
    sy, sx = (resize_filter.row_sums(taps, canvas) for taps in (taps_y, taps_x))
    scale_y, scale_x = normalisers(sy, sx, example, batch, one_tile_each)
    scale = resize_filter.SCALE
    return taps_y.at[:, scale].multiply(scale_y), taps_x.at[:, scale].multiply(scale_x)


def resize_tiles(
    tiles: jax.Array,
    example: jax.Array,
    params: jax.Array,
    *,
    batch: int,
    image_size: int,
    dtype: jnp.dtype = jnp.bfloat16,
    one_tile_each: bool = False,
    kernel: str = "xla",
    as_pixels: bool = False,
    interpret: bool = False,
) -> jax.Array:
    """The resized crops, float32 [batch, image_size, image_size, 3], unrounded; with
    `as_pixels` (`pallas` and `one_tile_each` only) uint8, rounded to the nearest, ties to even,
    and clipped to [0, 255] by the kernels (`crop_kernel.to_pixels`).

    Args:
      tiles: uint8 [T, canvas, canvas, 3], the decoded tiles of `plan_tiles` (padded).
      example: int32 [T], `TilePlan.example`.
      params: float32 [T, NUM_PARAMS], `TilePlan.params`.
      batch: examples in the batch.
      image_size: output height and width.
      dtype: the weights' and pixels' dtype in the products (float32 accumulation).
      one_tile_each: the plan is one tile per example, in order (`is_one_tile_each`): the sum
        over each example's tiles is skipped.
      kernel: `xla`, XLA's products over whole tiles; `pallas`, kernels that read only each
        tile's window (jia_jax/crop_kernel.py; Pallas' Triton backend, a GPU, or `interpret`).
      interpret: run the `pallas` kernels in Pallas' interpreter (CPU tests).
    """
    if kernel not in KERNELS:
        raise ValueError(f"kernel={kernel!r}: one of {KERNELS}")
    if as_pixels and not (kernel == "pallas" and one_tile_each):
        raise ValueError("as_pixels: the Pallas kernels with one tile each only (tiles of one "
                         "example are summed before rounding)")
    canvas = tiles.shape[1]
    # The Pallas kernels' blocks are powers of two: their taps have rows of scale 0 up to one.
    rows = crop_kernel.padded(image_size) if kernel == "pallas" else image_size
    taps_y, taps_x = normalised_taps(params, example, batch=batch, image_size=image_size,
                                     canvas=canvas, rows=rows, one_tile_each=one_tile_each)
    if kernel == "pallas":
        out = crop_kernel.resize_products(tiles, taps_y, taps_x, image_size=image_size,
                                          dtype=dtype, as_pixels=as_pixels, interpret=interpret)
    else:
        wy, wx = (resize_filter.weights(taps, canvas) for taps in (taps_y, taps_x))
        out = _xla_products(tiles, wy, wx, dtype)
    if one_tile_each:
        return out
    # `plan_tiles` lists an example's tiles together and in example order, padding last.
    return jax.ops.segment_sum(out, example, num_segments=batch, indices_are_sorted=True)


def _xla_products(tiles: jax.Array, wy: jax.Array, wx: jax.Array, dtype: jnp.dtype) -> jax.Array:
    """float32 [T, image_size, image_size, 3]: each tile's `Wy @ tile @ Wx^T`, XLA's products."""
    canvas, image_size = tiles.shape[1], wy.shape[1]
    # Both products read their operands as stored: the vertical one takes the tiles' rows
    # (h) as its contraction over [T, h, w c], the horizontal one the intermediate rows' columns
    # as theirs over [T, w, c s], so that neither operand is transposed in memory; only the
    # small output is, to [T, s, k, c]. With the rows kept as [T, s, w, c] XLA transposed them
    # before the horizontal product, and the program took 1.05 to 1.11 ms a batch of 256 on an
    # H200 against 0.91 to 0.98 ms this way (docs/benchmarks/gpu_decode_crop_layout_1xH200.json).
    t, channels = tiles.shape[0], tiles.shape[-1]
    pixels = tiles.astype(dtype).reshape(t, canvas, canvas * channels)
    columns = jnp.einsum(
        "thx,tsh->txs", pixels, wy.astype(dtype), preferred_element_type=jnp.float32
    ).astype(dtype).reshape(t, canvas, channels * image_size)
    return jnp.einsum(
        "twy,tkw->tyk", columns, wx.astype(dtype), preferred_element_type=jnp.float32
    ).reshape(t, channels, image_size, image_size).transpose(0, 2, 3, 1)


def is_one_tile_each(plan: TilePlan, batch: int) -> bool:
    """Whether `plan` (padded) holds exactly one tile per example of `batch`, in order: every
    image fits a canvas and none is missing, as for ImageNet at the default canvas."""
    return np.array_equal(plan.example, np.arange(batch))


@functools.partial(jax.jit, static_argnames=("batch", "image_size", "one_tile_each", "kernel",
                                             "interpret"))
def crop_resize(
    tiles: jax.Array,
    example: jax.Array,
    params: jax.Array,
    *,
    batch: int,
    image_size: int,
    one_tile_each: bool = False,
    kernel: str = "xla",
    interpret: bool = False,
) -> jax.Array:
    """uint8 [batch, image_size, image_size, 3]: the decoded tiles, uint8 [T, canvas, canvas, 3],
    cropped, resized and flipped per `TilePlan`, rounded to pixels (`one_tile_each`, `kernel`,
    `interpret`: see `resize_tiles`). The Pallas kernels round one tile each themselves."""
    in_kernel = kernel == "pallas" and one_tile_each
    resized = resize_tiles(
        tiles, example, params, batch=batch, image_size=image_size, one_tile_each=one_tile_each,
        kernel=kernel, as_pixels=in_kernel, interpret=interpret,
    )
    return resized if in_kernel else jnp.clip(jnp.round(resized), 0, 255).astype(jnp.uint8)
