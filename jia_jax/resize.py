"""Random-resized crops finished on the device: the resize the host pipeline would do, as matmuls.

The host decodes each JPEG and ships the pixels around its crop box (a window, zero-padded into a
fixed canvas) with the box; the jitted step turns the batch into `[B, S, S, 3]` images. This takes
the resize off the host CPU, which is what limits the input rate (docs/input_pipeline.md).

The weights are Pillow's (`Image.resize(size, BILINEAR, box=...)`): a triangle filter widened by
the downscaling factor (antialiasing), taps limited to the image, normalised per output pixel. A
window that keeps every tap of the box (`margin`) gives the same pixels as resizing the whole image.
Pillow rounds to uint8 after each pass and here nothing is rounded to integers, so the two differ
by at most about one level per pass (tests/test_resize.py states the bound).
"""

import math

import jax
import jax.numpy as jnp

# Keys of a train batch whose images are canvases still to be resized (tfds_input, device resize).
BOX, SIZE, FLIP, TRANSPOSE = "box", "window_size", "flip", "transpose"


def margin(box_extent: float, out_size: int) -> int:
    """Pixels around a box that hold every tap a bilinear resize of it to `out_size` reads.

    Pillow's first tap for an output pixel is `int(centre - support + 0.5)`, the edge pixels'
    centres lie half a step (`scale / 2`) inside the box and `support = max(scale, 1)`: so taps
    reach at most `max(scale, 1) / 2 + 0.5` pixels outside it, plus one for the rounding.
    """
    return math.ceil(max(box_extent / out_size, 1.0) / 2 + 0.5) + 1


def axis_weights(
    start: jax.Array, end: jax.Array, size: jax.Array, out_size: int, length: int
) -> jax.Array:
    """`[B, out_size, length]` weights resizing `[start, end)` of an axis of `size` pixels.

    Args:
      start, end: float [B], the box along this axis, in pixels of the canvas.
      size: int [B], pixels of this axis that hold the image (taps beyond are excluded).
      out_size: output pixels.
      length: the canvas's length along this axis (columns past `size` get weight 0).
    """
    scale = ((end - start) / out_size)[:, None]
    filter_scale = jnp.maximum(scale, 1.0)
    centre = start[:, None] + (jnp.arange(out_size) + 0.5) * scale  # [B, out]
    # Pillow's tap range: int(centre -/+ support + 0.5), clipped to the image.
    first = jnp.maximum(jnp.floor(centre - filter_scale + 0.5), 0.0)
    stop = jnp.minimum(jnp.floor(centre + filter_scale + 0.5), size[:, None].astype(centre.dtype))
    taps = jnp.arange(length, dtype=centre.dtype)[None, None, :]
    inside = (taps >= first[..., None]) & (taps < stop[..., None])
    triangle = jnp.maximum(
        1.0 - jnp.abs((taps + 0.5 - centre[..., None]) / filter_scale[..., None]), 0.0
    )
    weights = jnp.where(inside, triangle, 0.0)
    return weights / jnp.sum(weights, axis=-1, keepdims=True)


def crops_to_images(batch: dict[str, jax.Array], out_size: int, dtype: jnp.dtype) -> jax.Array:
    """`[B, out, out, 3]` float32 pixel values (0..255) of a batch of canvases.

    `batch` holds `image` uint8 [B, H, W, 3] (the window at the top left), `box` float32 [B, 4]
    (top, left, bottom, right in canvas pixels), `window_size` int32 [B, 2] (rows, columns that
    hold pixels), `transpose` int32 [B] (1: the window was stored transposed to fit the canvas)
    and `flip` int32 [B] (1: mirror left-right). The matmuls run in `dtype` (the model's compute
    dtype: pixels are exact in bf16 and fp16) with float32 accumulation.
    """
    canvas = batch["image"]
    _, height, width, _ = canvas.shape
    box = batch[BOX].astype(jnp.float32)
    size = batch[SIZE]
    rows = axis_weights(box[:, 0], box[:, 2], size[:, 0], out_size, height).astype(dtype)
    cols = axis_weights(box[:, 1], box[:, 3], size[:, 1], out_size, width).astype(dtype)
    pixels = canvas.astype(dtype)
    tall = jnp.einsum("byh,bhwc->bywc", rows, pixels, preferred_element_type=jnp.float32)
    images = jnp.einsum(
        "bxw,bywc->byxc", cols, tall.astype(dtype), preferred_element_type=jnp.float32
    )
    # A transposed window gives the transposed image; outputs are square, so swap back.
    transposed = batch[TRANSPOSE].astype(bool)[:, None, None, None]
    images = jnp.where(transposed, jnp.swapaxes(images, 1, 2), images)
    flipped = batch[FLIP].astype(bool)[:, None, None, None]
    return jnp.where(flipped, images[:, :, ::-1], images)
