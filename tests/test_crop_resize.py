"""Tests for jia_jax.crop_resize: the tile plan, and the device resize against Pillow's resize
recomputed in float64 numpy and against Pillow itself."""

import io

import jax
import jax.numpy as jnp
import numpy as np
import PIL.Image
import pytest

from jia_jax import crop_resize, crop_windows

_OUT = 12
_CANVAS = 32
# float32 positions below 4 canvases carry at most 128 x 2^-24 px of rounding, so each weight is
# off by under 1e-5 relative: under 255 x 1e-5 x (a few taps) < 0.01 levels of output.
_F32_LEVELS = 0.01
# bfloat16 weights and intermediate rows: 3 x 2^-8 x 255 (crop_resize's docstring).
_BF16_LEVELS = 3 * 2**-8 * 255
# Pillow rounds its intermediate rows and output (1 level in all), we our output (0.5), on top
# of our 3 levels: integers at most 4 apart.
_PILLOW_LEVELS = 4


def pillow_weights(in_size: int, out_size: int, start: float, stop: float) -> np.ndarray:
    """[out, in] normalised weights of Pillow's bilinear resize of [start, stop) (Resample.c,
    precompute_coeffs), in float64."""
    scale = (stop - start) / out_size
    filter_scale = max(scale, 1.0)
    support = 1.0 * filter_scale  # the bilinear filter's support is 1
    weights = np.zeros((out_size, in_size))
    for j in range(out_size):
        centre = start + (j + 0.5) * scale
        low = max(int(centre - support + 0.5), 0)
        high = min(int(centre + support + 0.5), in_size)
        for i in range(low, high):
            weights[j, i] = max(0.0, 1.0 - abs((i - centre + 0.5) / filter_scale))
        weights[j] /= weights[j].sum()
    return weights


def reference(image: np.ndarray, box, flip: bool) -> np.ndarray:
    """Pillow's resize of `box` of `image` to _OUT x _OUT, exact (float64, no rounding)."""
    height, width, _ = image.shape
    wy = pillow_weights(height, _OUT, box[1], box[3])
    wx = pillow_weights(width, _OUT, box[0], box[2])
    out = np.einsum("sh,hwc->swc", wy, image.astype(np.float64))
    out = np.einsum("kw,swc->skc", wx, out)
    return out[:, ::-1] if flip else out


def tiles_of(images: list[np.ndarray], plan: crop_resize.TilePlan, fill: int = 0) -> np.ndarray:
    """What a decoder writes for `plan`: each tile's region at its top-left corner, `fill`
    elsewhere (the resize must not read it)."""
    tiles = np.full((len(plan.example), _CANVAS, _CANVAS, 3), fill, np.uint8)
    for t, (example, (top, left, bottom, right)) in enumerate(
        zip(plan.example, plan.region, strict=True)
    ):
        if example < len(images):  # not a padding tile
            tiles[t, : bottom - top, : right - left] = images[example][top:bottom, left:right]
    return tiles


def cases(seed: int = 0):
    """Images of several sizes (smaller and larger than a canvas), with random train windows and
    eval windows, flipped or not."""
    rng = np.random.default_rng(seed)
    images, boxes, flips = [], [], []
    for height, width in [(20, 27), (37, 53), (80, 61), (31, 31), (100, 140), (9, 7)]:
        image = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        for _ in range(3):
            box, flip = crop_windows.train_window(rng, width, height)
            images.append(image), boxes.append(box), flips.append(flip)
        images.append(image), boxes.append(crop_windows.eval_crop_box(width, height))
        flips.append(False)
    return images, np.array(boxes), np.array(flips)


def resized(images, boxes, flips, dtype, has_image=None, fill=0, kernel="xla"):
    sizes = np.array([(im.shape[1], im.shape[0]) for im in images])
    has_image = np.ones(len(images), bool) if has_image is None else has_image
    plan = crop_resize.plan_tiles(boxes, sizes, flips, has_image, _OUT, _CANVAS)
    count = crop_resize.padded_count(len(plan.example), len(images))
    plan = crop_resize.pad_plan(plan, count, len(images))
    tiles = tiles_of(images, plan, fill)
    out = crop_resize.resize_tiles(
        jnp.asarray(tiles),
        jnp.asarray(plan.example),
        jnp.asarray(plan.params),
        batch=len(images),
        image_size=_OUT,
        dtype=dtype,
        kernel=kernel,
        interpret=kernel == "pallas",  # Pallas' interpreter: the kernels' logic on the CPU
    )
    return np.asarray(out, np.float64), plan


def test_an_image_within_a_canvas_is_one_whole_tile_a_larger_one_a_grid_of_regions():
    images, boxes, flips = cases()
    _, plan = resized(images, boxes, flips, jnp.float32)
    counts = np.bincount(plan.example, minlength=len(images) + 1)
    # Padding: a multiple of a quarter of the batch (24 examples: 6).
    assert len(plan.example) % 6 == 0 and counts[len(images)] == len(plan.example) - counts[:-1].sum()
    assert np.all(plan.region[plan.example == len(images)] == 0)
    # A 140-wide image's full-width crop reaches over 4 canvases of 32.
    assert counts[: len(images)].max() >= 4
    for example, image in enumerate(images):
        height, width, _ = image.shape
        regions = plan.region[plan.example == example]
        if height <= _CANVAS and width <= _CANVAS:
            np.testing.assert_array_equal(regions, [[0, 0, height, width]])
            continue
        top, left, bottom, right = regions.T
        ys, xs = np.unique(top), np.unique(left)
        assert len(regions) == len(ys) * len(xs)  # a full grid
        assert np.all(np.diff(ys) == _CANVAS) and np.all(np.diff(xs) == _CANVAS)
        # Each region is the tile's canvas from its origin, clipped to the image: never past it.
        np.testing.assert_array_equal(bottom, np.minimum(top + _CANVAS, height))
        np.testing.assert_array_equal(right, np.minimum(left + _CANVAS, width))
        assert np.all((top < bottom) & (left < right))
        # The grid covers what the resize reads: the crop's window and the filter's reach.
        box = boxes[example]
        spans = [(box[1], box[3], top, bottom, height), (box[0], box[2], left, right, width)]
        for start, stop, low, high, extent in spans:
            reach = max((stop - start) / _OUT, 1.0)
            assert low.min() <= max(np.floor(start - reach), 0)
            assert high.max() >= min(np.ceil(stop + reach), extent)


@pytest.mark.parametrize("kernel", ["xla", "pallas"])
def test_what_a_tile_holds_past_its_region_is_never_read(kernel):
    images, boxes, flips = cases()
    zeros, _ = resized(images, boxes, flips, jnp.float32, kernel=kernel)
    filled, _ = resized(images, boxes, flips, jnp.float32, fill=255, kernel=kernel)
    np.testing.assert_array_equal(filled, zeros)


def test_padded_count_is_a_quarter_batch_multiple_of_at_least_one_tile():
    assert [crop_resize.padded_count(n, 256) for n in (0, 1, 64, 256, 257, 330)] == [
        64,
        64,
        64,
        256,
        320,
        384,
    ]
    assert crop_resize.padded_count(3, 2) == 3


@pytest.mark.parametrize("kernel", ["xla", "pallas"])
@pytest.mark.parametrize("dtype, levels", [(jnp.float32, _F32_LEVELS), (jnp.bfloat16, _BF16_LEVELS)])
def test_resize_is_pillows_filter_within_the_rounding_bound(dtype, levels, kernel):
    images, boxes, flips = cases()
    out, _ = resized(images, boxes, flips, dtype, kernel=kernel)
    expected = np.stack([reference(*args) for args in zip(images, boxes, flips, strict=True)])
    error = np.abs(out - expected).max()
    assert error <= levels, error
    if dtype == jnp.bfloat16:  # the bound is not loose by orders of magnitude
        assert error > 0.05


def test_examples_without_an_image_are_zeros():
    images, boxes, flips = cases()
    has_image = np.arange(len(images)) % 3 != 0
    out, plan = resized(images, boxes, flips, jnp.float32, has_image)
    assert not np.isin(np.flatnonzero(~has_image), plan.example).any()
    assert np.all(out[~has_image] == 0) and np.all(out[has_image].max(axis=(1, 2, 3)) > 0)


def test_uint8_output_is_within_3_levels_of_pillow():
    images, boxes, flips = cases(seed=1)
    sizes = np.array([(im.shape[1], im.shape[0]) for im in images])
    plan = crop_resize.plan_tiles(boxes, sizes, flips, np.ones(len(images), bool), _OUT, _CANVAS)
    tiles = jnp.asarray(tiles_of(images, plan))
    out = crop_resize.crop_resize(
        tiles, plan.example, plan.params, batch=len(images), image_size=_OUT
    )
    assert out.dtype == jnp.uint8
    for image, box, flip, got in zip(images, boxes, flips, np.asarray(out), strict=True):
        pil = PIL.Image.fromarray(image).resize((_OUT, _OUT), PIL.Image.BILINEAR, box=tuple(box))
        pil = np.asarray(pil)[:, ::-1] if flip else np.asarray(pil)
        assert np.abs(got.astype(int) - pil).max() <= _PILLOW_LEVELS


def test_equals_scale_and_translate_where_a_tile_holds_only_image():
    # jax.image.scale_and_translate normalises over its whole input: the same filter as ours when
    # that input is all image, as in a single tile of a canvas-sized image.
    rng = np.random.default_rng(2)
    image = rng.integers(0, 256, (_CANVAS, _CANVAS, 3), dtype=np.uint8)
    for _ in range(5):
        box, _ = crop_windows.train_window(rng, _CANVAS, _CANVAS)
        out, plan = resized([image], np.array([box]), np.array([False]), jnp.float32)
        assert len(plan.example) == 1 or set(plan.example[1:]) == {1}
        scale = jnp.array([_OUT / (box[3] - box[1]), _OUT / (box[2] - box[0])])
        expected = jax.image.scale_and_translate(
            jnp.asarray(image, jnp.float32),
            (_OUT, _OUT, 3),
            (0, 1),
            scale,
            -jnp.array([box[1], box[0]], jnp.float32) * scale,
            method="linear",
        )
        np.testing.assert_allclose(out[0], expected, atol=_F32_LEVELS)


def test_decoded_jpeg_tiles_resize_like_the_cpu_path():
    """A JPEG decoded whole by Pillow, cut into tiles, resized here: within 4 levels of the CPU
    path's Pillow resize of the same window."""
    rng = np.random.default_rng(3)
    coarse = PIL.Image.fromarray(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8))
    encoded = io.BytesIO()
    coarse.resize((90, 70), PIL.Image.BICUBIC).save(encoded, format="JPEG", quality=90)
    decoded = np.asarray(PIL.Image.open(io.BytesIO(encoded.getvalue())).convert("RGB"))
    box, flip = crop_windows.train_window(rng, 90, 70)
    out, _ = resized([decoded], np.array([box]), np.array([flip]), jnp.bfloat16)
    cpu = PIL.Image.fromarray(decoded).resize((_OUT, _OUT), PIL.Image.BILINEAR, box=box)
    cpu = np.asarray(cpu)[:, ::-1] if flip else np.asarray(cpu)
    assert np.abs(np.clip(np.round(out[0]), 0, 255) - cpu).max() <= _PILLOW_LEVELS


def within_a_canvas(seed: int) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """Random images that each fit a canvas (one tile an example), with train crop windows."""
    rng = np.random.default_rng(seed)
    images, boxes, flips = [], [], []
    for height, width in [(20, 27), (31, 31), (9, 7), (32, 18)]:
        images.append(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))
        box, flip = crop_windows.train_window(rng, width, height)
        boxes.append(box), flips.append(flip)
    return images, np.array(boxes), np.array(flips)


def test_one_tile_each_program_equals_the_general_one_and_pillows_filter():
    """Images that all fit a canvas, none missing: the plan is one tile per example, and the
    program that skips the per-example sum gives the general program's result exactly, within
    the bfloat16 bound of Pillow's filter; a larger image or a missing one is not such a plan."""
    images, boxes, flips = within_a_canvas(seed=4)
    general, plan = resized(images, boxes, flips, jnp.bfloat16)
    assert crop_resize.is_one_tile_each(plan, len(images))
    fast = crop_resize.resize_tiles(
        jnp.asarray(tiles_of(images, plan)), jnp.asarray(plan.example),
        jnp.asarray(plan.params), batch=len(images), image_size=_OUT, one_tile_each=True,
    )
    np.testing.assert_array_equal(np.asarray(fast, np.float64), general)
    expected = np.stack([reference(*args) for args in zip(images, boxes, flips, strict=True)])
    assert np.abs(general - expected).max() <= _BF16_LEVELS
    many, many_plan = cases()[0], resized(*cases(), jnp.float32)[1]
    assert not crop_resize.is_one_tile_each(many_plan, len(many))  # larger images: grids
    missing = np.array([True, True, False, True])
    _, missing_plan = resized(images, boxes, flips, jnp.float32, missing)
    assert not crop_resize.is_one_tile_each(missing_plan, len(images))


def test_crop_resize_with_pallas_rounds_one_tile_each_in_its_kernel_as_after_it():
    """`crop_resize` with the Pallas kernels and one tile each rounds in the kernel: the same
    pixels, bit for bit, as rounding `resize_tiles`' float32 sums; other plans are refused."""
    images, boxes, flips = within_a_canvas(seed=7)
    sums, plan = resized(images, boxes, flips, jnp.bfloat16, kernel="pallas")
    assert crop_resize.is_one_tile_each(plan, len(images))
    args = (jnp.asarray(tiles_of(images, plan)), jnp.asarray(plan.example),
            jnp.asarray(plan.params))
    got = crop_resize.crop_resize(*args, batch=len(images), image_size=_OUT, one_tile_each=True,
                                  kernel="pallas", interpret=True)
    assert got.dtype == jnp.uint8
    np.testing.assert_array_equal(np.asarray(got), np.clip(np.round(sums), 0, 255))
    with pytest.raises(ValueError, match="one tile each"):
        crop_resize.resize_tiles(*args, batch=len(images), image_size=_OUT, kernel="pallas",
                                 as_pixels=True, interpret=True)
