"""Pillow's bilinear resize filter along one axis of a tile, as four numbers an output sample.

Output sample j of a crop starting at `start` with `length` source pixels, resized to `out_size`,
is centred at `start + (j + 0.5) * length / out_size` (Pillow's centre, in the tile's
coordinates); pixel i sits at `i + 0.5`; its weight is `max(0, 1 - |distance| / support)`, the
support being 1 when upscaling and the scale factor when downscaling (antialiasing), and 0 for
pixels at or past `valid` (outside the image). A row of weights is so determined by its taps:
(centre, support, valid, scale), `scale` the factor that normalises it (0 for a row that is no
sample). The GPU crop kernels compute each block of weights from the taps as they multiply
(jia_jax/crop_kernel.py) instead of reading a dense [rows, canvas] matrix that is 98% zeros;
XLA's products get the dense matrix from the same formula (`weights`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# Where each quantity sits along a taps array's axis -2.
CENTRE, SUPPORT, VALID, SCALE = range(4)
NUM_TAPS = 4


def axis_taps(start: jax.Array, length: jax.Array, valid: jax.Array, out_size: int, rows: int,
              flip: jax.Array | bool = False) -> jax.Array:
    """float32 [T, NUM_TAPS, rows]: per tile ([T] arguments, positions relative to its origin)
    the taps of its `out_size` samples, in reverse order where `flip` (flipping the output is
    reading the samples backwards), then rows of scale 0 up to `rows`; the scale is 1 for
    samples, to be normalised (`row_sums`)."""
    scale = (length / out_size)[:, None]
    row = jnp.arange(rows)
    order = jnp.where(jnp.asarray(flip)[..., None], out_size - 1 - row, row)
    centre = start[:, None] + (order.astype(jnp.float32) + 0.5) * scale
    shape = centre.shape
    return jnp.stack([centre, jnp.broadcast_to(jnp.maximum(scale, 1.0), shape),
                      jnp.broadcast_to(valid[:, None], shape),
                      jnp.broadcast_to((row < out_size).astype(jnp.float32), shape)], axis=-2)


def triangle(pixel: jax.Array, centre: jax.Array, support: jax.Array, valid: jax.Array,
             scale: jax.Array) -> jax.Array:
    """float32: the weight of integer `pixel` for the sample of these taps (all broadcast),
    times its scale. One formula for XLA's dense weights and inside the Triton kernels, so
    both get the same bits."""
    position = pixel.astype(jnp.float32)
    # Times the reciprocal: a division per row in the kernels, not one per weight.
    weight = jnp.maximum(1.0 - jnp.abs(position + 0.5 - centre) * (1.0 / support), 0.0)
    return jnp.where(position < valid, weight, 0.0) * scale


def weights(taps: jax.Array, count: int) -> jax.Array:
    """float32 [..., rows, count]: the dense weights of `taps` [..., NUM_TAPS, rows] over
    pixels 0..count-1."""
    pixel = jnp.arange(count, dtype=jnp.int32)
    return triangle(pixel, *(taps[..., q, :, None] for q in range(NUM_TAPS)))


def row_sums(taps: jax.Array, count: int) -> jax.Array:
    """float32 [..., rows]: each row's `weights` summed over pixels 0..count-1, in closed form
    (arithmetic series on each side of the centre) instead of over `count` pixels.

    Pixels left of the centre with a nonzero weight are those i with i + 0.5 <= c and
    c - (i + 0.5) < s; their distances d_i = c - 0.5 - i form a series of step 1, so n of them
    sum to n (d_first + d_last) / 2 and their weights to n - that / s. Likewise right of it.
    Distances are formed from the nearest pixel's (under 1) so that no large position cancels.
    """
    centre, support, valid, scale = (taps[..., q, :] for q in range(NUM_TAPS))
    last = jnp.minimum(jnp.ceil(valid), count) - 1  # the last pixel in the image
    middle = jnp.floor(centre - 0.5)  # the last pixel at or left of the centre
    left_first = jnp.maximum(jnp.floor(centre - 0.5 - support) + 1, 0)
    left_last = jnp.minimum(middle, last)
    right_first = jnp.maximum(middle + 1, 0)
    right_last = jnp.minimum(jnp.ceil(centre - 0.5 + support) - 1, last)

    def side(near_distance, terms):
        terms = jnp.maximum(terms, 0.0)
        far = near_distance + jnp.maximum(terms - 1, 0.0)
        return terms - terms * (near_distance + far) / (2 * support)

    left = side(centre - 0.5 - left_last, left_last - left_first + 1)
    right = side(right_first + 0.5 - centre, right_last - right_first + 1)
    return (left + right) * scale
