"""`jia_jax.models.max_pool` is flax's max-pool: forward and gradient against a float64 numpy
reference, ties included, in fp32 and bf16, and against `flax.linen.max_pool` itself.

The forward of a max is exact in any dtype (it returns one of its inputs), so it is compared
exactly. Each input's gradient is a sum of the cotangents of the windows it wins, at most
ceil(3/2)^2 = 4 of them for a 3x3/2 pool: summed in fp32 (error <= 3 * 2^-24 * sum|terms|) and
rounded once to the dtype (<= u |exact|, u = 2^-24 in fp32, 2^-8 in bf16).
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jia_jax.models.max_pool import max_pool

UNIT_ROUNDOFF = {jnp.float32: 2.0**-24, jnp.bfloat16: 2.0**-8}
DTYPES = pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["fp32", "bf16"])
# (input height, width, padding): ResNet's stem pool on even and odd sizes, AlexNet's VALID pools
# (55 -> 27 in the real net; 13 leaves a remainder column) and its small-input padded ones.
GEOMETRIES = pytest.mark.parametrize(
    "h, w, padding",
    [
        (8, 8, ((1, 1), (1, 1))),
        (9, 10, ((1, 1), (1, 1))),
        (13, 14, "VALID"),
        (5, 5, ((1, 1), (1, 1))),
    ],
    ids=["resnet_even", "resnet_odd", "alexnet_valid", "alexnet_small"],
)


def _reference(x, g, padding, last=False):
    """numpy float64 3x3/2 max-pool: output, input gradient, sum of |terms| per input, and the
    number of windows with tied maxima. `last` sends the gradient to the last maximum instead."""
    pad = ((0, 0), (0, 0)) if padding == "VALID" else padding
    n, h, w, c = x.shape
    xp = np.pad(x, ((0, 0), *pad, (0, 0)), constant_values=-np.inf)
    oh, ow = (xp.shape[1] - 3) // 2 + 1, (xp.shape[2] - 3) // 2 + 1
    taps = np.stack(
        [xp[:, i : i + 2 * oh - 1 : 2, j : j + 2 * ow - 1 : 2] for i in range(3) for j in range(3)]
    )
    y = taps.max(axis=0)
    ties = int(np.sum((taps == y).sum(axis=0) > 1))
    # np.argmax returns the first maximum; on the reversed taps, the last one.
    winner = 8 - np.argmax(taps[::-1], axis=0) if last else np.argmax(taps, axis=0)
    dxp, absp = np.zeros(xp.shape), np.zeros(xp.shape)
    b, r, q, ch = np.indices(y.shape)
    rows, cols = 2 * r + winner // 3, 2 * q + winner % 3
    np.add.at(dxp, (b, rows, cols, ch), g)
    np.add.at(absp, (b, rows, cols, ch), np.abs(g))
    crop = (slice(None), slice(pad[0][0], pad[0][0] + h), slice(pad[1][0], pad[1][0] + w))
    return y, dxp[crop], absp[crop], ties


def _pool(x, g, padding):
    y, vjp = jax.vjp(jax.jit(lambda v: max_pool(v, (3, 3), (2, 2), padding)), x)
    return y, vjp(g)[0]


def _distinct(shape, dtype, rng):
    """Values distinct after rounding to `dtype`, in random order: no window has a tie."""
    pool = np.unique(np.asarray(jnp.asarray(rng.standard_normal(8 * np.prod(shape)), dtype), float))
    return jnp.asarray(rng.permutation(pool)[: np.prod(shape)].reshape(shape), dtype)


@DTYPES
@GEOMETRIES
def test_forward_and_gradient_match_float64_without_ties(dtype, h, w, padding):
    rng = np.random.default_rng(0)
    x = _distinct((2, h, w, 3), dtype, rng)
    x64 = np.asarray(x, np.float64)
    y_ref, _, _, ties = _reference(x64, np.zeros((1,)), padding)
    assert ties == 0
    g = jnp.asarray(rng.standard_normal(y_ref.shape), dtype)
    g64 = np.asarray(g, np.float64)
    y_ref, dx_ref, abs_terms, _ = _reference(x64, g64, padding)

    y, dx = _pool(x, g, padding)
    assert y.dtype == dx.dtype == dtype and dx.shape == x.shape
    np.testing.assert_array_equal(np.asarray(y, np.float64), y_ref)
    err = np.abs(np.asarray(dx, np.float64) - dx_ref)
    assert np.all(err <= UNIT_ROUNDOFF[dtype] * np.abs(dx_ref) + 3 * 2.0**-24 * abs_terms)
    assert np.count_nonzero(dx_ref) > 0  # the gradient reaches the inputs


@DTYPES
def test_ties_send_the_gradient_to_the_first_maximum_in_window_order(dtype):
    """Values from {0, 1, 2} (post-ReLU zeros and repeats): most windows tie. Integer cotangents
    keep every sum exact in both dtypes, so all three agree exactly; a last-maximum rule differs."""
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.integers(0, 3, (2, 10, 9, 4)), dtype)
    padding = ((1, 1), (1, 1))
    x64 = np.asarray(x, np.float64)
    g = jnp.asarray(rng.integers(1, 9, _reference(x64, np.zeros(1), padding)[0].shape), dtype)
    g64 = np.asarray(g, np.float64)
    _, dx_first, _, ties = _reference(x64, g64, padding)
    _, dx_last, _, _ = _reference(x64, g64, padding, last=True)
    assert ties > 0 and not np.array_equal(dx_first, dx_last)

    _, dx = _pool(x, g, padding)
    np.testing.assert_array_equal(np.asarray(dx, np.float64), dx_first)
    # XLA's select-and-scatter, flax's gradient, follows the same rule.
    _, flax_vjp = jax.vjp(lambda v: nn.max_pool(v, (3, 3), (2, 2), padding), x)
    np.testing.assert_array_equal(np.asarray(flax_vjp(g)[0], np.float64), dx_first)


@GEOMETRIES
def test_same_output_and_gradient_as_flax_fp32(h, w, padding):
    """Integer-valued cotangents: both gradients are exact sums, so they are equal."""
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.standard_normal((2, h, w, 3)), jnp.float32)
    y_flax, flax_vjp = jax.vjp(lambda v: nn.max_pool(v, (3, 3), (2, 2), padding), x)
    g = jnp.asarray(rng.integers(-4, 5, y_flax.shape), jnp.float32)
    y, dx = _pool(x, g, padding)
    np.testing.assert_array_equal(y, y_flax)
    np.testing.assert_array_equal(dx, flax_vjp(g)[0])


def test_bad_arguments_name_the_problem():
    x = jnp.zeros((1, 4, 4, 1))
    with pytest.raises(ValueError, match="floating NHWC"):
        max_pool(x.astype(jnp.int32), (3, 3), (2, 2), "VALID")
    with pytest.raises(ValueError, match="does not fit"):
        max_pool(x, (3, 3), (2, 2), ((-1, 0), (0, 0)))


@pytest.mark.parametrize(
    "window, strides, padding",
    [
        ((2, 2), (2, 2), "VALID"),
        ((3, 3), (1, 1), ((1, 1), (1, 1))),
        ((5, 3), (2, 3), ((2, 1), (0, 2))),
        ((4, 4), (3, 2), ((0, 0), (1, 1))),
    ],
    ids=["2x2/2", "3x3/1", "5x3/2x3", "4x4/3x2"],
)
def test_other_windows_and_strides_give_flax_gradient(window, strides, padding):
    """Each input gathers from up to ceil(k/s) windows per axis, whatever k and s: with no ties
    (distinct values) and integer cotangents, flax's gradient is the exact same sums."""
    rng = np.random.default_rng(3)
    x = _distinct((2, 11, 10, 3), jnp.float32, rng)
    y_flax, flax_vjp = jax.vjp(lambda v: nn.max_pool(v, window, strides, padding), x)
    g = jnp.asarray(rng.integers(-4, 5, y_flax.shape), jnp.float32)
    y, vjp = jax.vjp(jax.jit(lambda v: max_pool(v, window, strides, padding)), x)
    np.testing.assert_array_equal(y, y_flax)
    np.testing.assert_array_equal(vjp(g)[0], flax_vjp(g)[0])
