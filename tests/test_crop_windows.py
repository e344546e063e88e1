"""Tests for jia_jax.crop_windows: the crop windows both input paths share."""

import numpy as np

from jia_jax import crop_windows


def test_random_crop_box_stays_in_range():
    rng = np.random.default_rng(0)
    for width, height in [(500, 375), (375, 500), (64, 64)]:
        for _ in range(300):
            left, top, right, bottom = crop_windows.random_crop_box(rng, width, height)
            w, h = right - left, bottom - top
            assert 0 <= left < right <= width and 0 <= top < bottom <= height
            # w and h are rounded from a sampled box: some box within half a pixel of each side must
            # satisfy the ranges.
            assert (w + 0.5) / (h - 0.5) >= 3 / 4 and (w - 0.5) / (h + 0.5) <= 4 / 3
            assert (w + 0.5) * (h + 0.5) >= 0.08 * width * height


def test_random_crop_box_falls_back_to_a_centred_crop():
    # No box of 8% of a 1000x10 image has an aspect ratio of at most 4/3: the fallback is the
    # centred 13x10 box (ratio clamped to 4/3, width rounded).
    box = crop_windows.random_crop_box(np.random.default_rng(0), 1000, 10)
    assert box == (493, 0, 506, 10)


def test_eval_crop_box_matches_resize_then_center_crop():
    # Resize the shorter side of a 500x375 image to 256, centre-crop 224: in source pixels that is a
    # square of 224 * 375 / 256 = 328.125 centred in the image.
    side = 224 * 375 / 256
    expected = ((500 - side) / 2, (375 - side) / 2, (500 + side) / 2, (375 + side) / 2)
    np.testing.assert_allclose(crop_windows.eval_crop_box(500, 375), expected, rtol=0, atol=1e-9)
