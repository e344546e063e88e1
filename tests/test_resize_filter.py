"""jia_jax.resize_filter: the taps' weights against Pillow's filter in float64 numpy, and the
closed-form row sums against summing the weights in float64."""

import jax.numpy as jnp
import numpy as np
import pytest

from jia_jax import resize_filter

U32 = 2.0**-24  # float32 unit roundoff


def dense64(centre, support, valid, count):
    """float64 [..., count]: the triangle filter at pixels 0..count-1 (Pillow's bilinear), in
    numpy, per row of `centre`, `support` and `valid` (arrays of one shape)."""
    pixel = np.arange(count, dtype=np.float64) + 0.5
    weight = np.maximum(1.0 - np.abs(pixel - centre[..., None]) / support[..., None], 0.0)
    return np.where(np.arange(count) < valid[..., None], weight, 0.0)


@pytest.mark.parametrize("seed", [0, 1])
def test_row_sums_are_the_weights_summed(seed):
    """Centres inside, near and outside the pixels, supports from 1 to 40, images ending before,
    inside and past the count, none at all; integer and half-integer centres (a pixel's weight
    exactly 0 at the support's edge). Each closed-form sum is a handful of float32 operations
    on distances of at most |centre| + count + 1 over the support, times at most 2 s + 2 terms:
    within 8 u of (2 s + 2)(1 + (|c| + count + 1) / s) of the float64 sum."""
    rng = np.random.default_rng(seed)
    count, rows = 64, 4000
    centre = rng.uniform(-50, count + 50, rows)
    centre[:200] = np.round(centre[:200]) + rng.choice([0.0, 0.5], 200)
    support = np.where(rng.uniform(size=rows) < 0.3, 1.0, rng.uniform(1.0, 40.0, rows))
    support[:100] = np.round(support[:100])
    valid = rng.integers(-3, count + 6, rows).astype(np.float64)
    scale = rng.uniform(0.5, 2.0, rows)
    taps = np.stack([centre, support, valid, scale]).astype(np.float32)[None]  # [1, 4, rows]
    got = np.asarray(resize_filter.row_sums(jnp.asarray(taps), count), np.float64)[0]
    c, s, v, k = (taps[0, q].astype(np.float64) for q in range(4))
    want = dense64(c, s, v, count).sum(-1) * k
    bound = 8 * U32 * (2 * s + 2) * (1 + (np.abs(c) + count + 1) / s) * k
    assert np.all(np.abs(got - want) <= bound), np.max(np.abs(got - want) / bound)
    assert np.sum(want == 0) > 100 and np.sum(want > 10) > 100  # empty rows and wide ones


def test_weights_are_pillows_filter_and_flip_reverses_the_samples():
    """`axis_taps` then `weights`: sample j centred at start + (j + 0.5) length / out, rows past
    `out` zero, a flipped tile's rows in reverse order; float32 positions within 1e-5."""
    start = np.array([3.25, -7.0, 10.0], np.float32)
    length = np.array([20.5, 40.0, 6.0], np.float32)
    valid = np.array([30.0, 28.0, 64.0], np.float32)
    out, rows, count = 8, 16, 32
    got = [np.asarray(resize_filter.weights(resize_filter.axis_taps(
        jnp.asarray(start), jnp.asarray(length), jnp.asarray(valid), out, rows,
        flip=jnp.full(3, flip)), count), np.float64) for flip in (False, True)]
    scale = length.astype(np.float64) / out
    centre = start[:, None] + (np.arange(out) + 0.5) * scale[:, None]
    want = dense64(centre, np.broadcast_to(np.maximum(scale, 1)[:, None], centre.shape),
                    np.broadcast_to(valid[:, None], centre.shape), count)
    np.testing.assert_allclose(got[0][:, :out], want, atol=1e-5)
    np.testing.assert_allclose(got[1][:, :out], want[:, ::-1], atol=1e-5)
    assert not got[0][:, out:].any() and not got[1][:, out:].any()
