"""`scripts.bench.conv_stats`: each variant computes the 1x1 convolution and its BatchNorm
statistics it names, against float64 numpy (the Pallas kernel in Pallas's interpreter, on CPU)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scripts.bench import conv_stats

U32 = 2.0**-24  # fp32 unit roundoff
B16 = 2.0**-8  # bf16 unit roundoff


def _inputs(m=512, k=96, n=64, offset=100.0):
    kx, kw = jax.random.split(jax.random.key(3))
    x = jax.random.normal(kx, (m, k), jnp.bfloat16)
    w = (jax.random.normal(kw, (k, n)) / k**0.5).astype(jnp.bfloat16)
    # A column of ones and a large weight give every channel a mean far from 0 against its
    # spread: unshifted one-pass sums would lose the variance's digits there.
    x = x.at[:, 0].set(1.0)
    w = w.at[0].set(offset)
    return x, w


def _var_bound(y64: np.ndarray, shifts: np.ndarray) -> np.ndarray:
    """fp32 rounding of m terms (m u) times the scale of what is summed: the squared deviations
    from values of the same channel (`shifts`: the first sample for `moments`, each tile's first
    row for the shifted tile sums; the two-pass tiles' own means are closer), never the squared
    mean itself, which is what unshifted sums pay."""
    m = y64.shape[0]
    return 4 * m * U32 * (y64.var(0) + ((shifts - y64.mean(0)) ** 2).max(0))


def _check(y, mean, var, x, w, tile_rows=None):
    x64, w64 = np.asarray(x, np.float64), np.asarray(w, np.float64)
    want, terms = x64 @ w64, np.abs(x64) @ np.abs(w64)
    k = x.shape[1]
    # y: k products summed in fp32, rounded to bf16.
    bound = (k - 1) * U32 * terms + B16 * (np.abs(want) + (k - 1) * U32 * terms)
    assert np.all(np.abs(np.asarray(y, np.float64) - want) <= bound)
    y64 = np.asarray(y, np.float64)  # the statistics are those of the bf16 y
    m = y64.shape[0]
    mean64, var64 = y64.mean(0), y64.var(0)
    # The mean: fp32 sums of m terms of size at most |mean| + 6 std.
    std = np.sqrt(var64)
    assert np.all(np.abs(np.asarray(mean) - mean64) <= m * U32 * (np.abs(mean64) + 6 * std))
    shifts = y64[::tile_rows] if tile_rows else y64[:1]
    assert np.all(np.abs(np.asarray(var) - var64) <= _var_bound(y64, shifts))


def test_the_variance_bound_refuses_unshifted_sums():
    """The inputs put every channel's mean far from 0 against its spread, where E[y^2] - E[y]^2
    in fp32 loses the variance's digits: that form breaks the bound the variants must keep."""
    x, w = _inputs()
    y, *_ = jax.jit(conv_stats.xla_conv_stats)(x, w)
    y64, y32 = np.asarray(y, np.float64), jnp.asarray(y, jnp.float32)
    assert np.all(np.abs(y64.mean(0)) > 30 * y64.std(0))
    unshifted = np.asarray(jnp.mean(y32 * y32, 0) - jnp.mean(y32, 0) ** 2, np.float64)
    assert np.any(np.abs(unshifted - y64.var(0)) > _var_bound(y64, y64[:1]))


@pytest.mark.parametrize("variant", ["xla", "pallas", "pallas_shifted"])
def test_conv_and_statistics_match_float64(variant):
    x, w = _inputs()
    fn = conv_stats.VARIANTS[variant]
    if variant.startswith("pallas"):  # 4 row tiles of 128, 3 steps of 32 along k
        fn = functools.partial(fn, block_m=128, block_n=64, block_k=32, interpret=True)
    _check(*jax.jit(fn)(x, w), x, w, tile_rows=128 if variant == "pallas_shifted" else None)


@pytest.mark.parametrize("variant", ["xla_gemm", "pallas_gemm"])
def test_products_alone_equal_the_full_variants_product(variant):
    x, w = _inputs()
    fn = conv_stats.VARIANTS[variant]
    if variant == "pallas_gemm":
        fn = functools.partial(fn, block_m=128, block_n=64, block_k=32, interpret=True)
    y, *_ = jax.jit(conv_stats.xla_conv_stats)(x, w)
    got = np.asarray(jax.jit(fn)(x, w), np.float64)
    k = x.shape[1]
    terms = np.abs(np.asarray(x, np.float64)) @ np.abs(np.asarray(w, np.float64))
    y64 = np.asarray(y, np.float64)
    # Two fp32 summation orders, each sum within (k - 1) u sum|terms| of the exact one, each
    # rounded to bf16 (B16 of its size).
    bound = 2 * (k - 1) * U32 * terms + B16 * (np.abs(got) + np.abs(y64))
    assert np.all(np.abs(got - y64) <= bound)


def test_tile_combination_is_the_mean_and_variance_of_all_rows():
    rows = np.random.default_rng(0).normal(5.0, 2.0, (6 * 8, 3))
    tiles = rows.reshape(6, 8, 3)
    means = tiles.mean(1)
    squares = ((tiles - means[:, None]) ** 2).sum(1)
    mean, var = conv_stats.combine(jnp.asarray(means, jnp.float32),
                                   jnp.asarray(squares, jnp.float32), 8)
    np.testing.assert_allclose(mean, rows.mean(0), rtol=1e-6)
    np.testing.assert_allclose(var, rows.var(0), rtol=1e-5)


def test_a_named_tiling_computes_the_same_and_a_bad_one_is_refused():
    x, w = _inputs()
    tiled = conv_stats.variant("pallas@64x32x16x8x2")
    assert tiled.keywords == {"block_m": 64, "block_n": 32, "block_k": 16, "num_warps": 8,
                              "num_stages": 2}
    _check(*jax.jit(functools.partial(tiled, interpret=True))(x, w), x, w)
    with pytest.raises(ValueError, match="only the Pallas variants"):
        conv_stats.variant("xla@64x32x16x8x2")
    with pytest.raises(ValueError, match="BMxBNxBKxWARPSxSTAGES"):
        conv_stats.variant("pallas@64x32")


def test_input_stats_are_the_exact_products_within_their_rounding():
    """`xla_input_stats` of bf16 x (a ReLU's output) and w against float64 statistics of x @ w.

    fp32 sums of M terms err by at most M u times the sum of their sizes: the mean of x by
    M u mean|x|, the entries of x^T x / M by M u E|x_i x_j| (bf16 products are exact in fp32),
    and mean(x) mean(x)^T by about 2 u |mean_i mean_j|; the [K, K] and [K, N] products add K u of
    their terms. So var(y) errs by at most (M + 2K) u |w|^T (E|x x^T| + |mean mean^T|) |w|, the
    mean by (M + K) u mean|x| @ |w|. A wrong formula errs by O(var).
    """
    rng = np.random.default_rng(2)
    m, k, n = 4096, 64, 256
    x = jnp.asarray(np.maximum(rng.standard_normal((m, k)), 0.0), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((k, n)) / 8.0, jnp.bfloat16)
    y, mean, var = jax.jit(conv_stats.xla_input_stats)(x, w)
    y_plain, *_ = jax.jit(conv_stats.xla_conv_stats)(x, w)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(y_plain))
    x64, w64 = np.asarray(x, np.float64), np.asarray(w, np.float64)
    y64 = x64 @ w64
    abs_x, abs_w = np.abs(x64), np.abs(w64)
    second = abs_x.T @ abs_x / m + np.outer(abs_x.mean(0), abs_x.mean(0))
    var_bound = (m + 2 * k) * U32 * np.sum(abs_w * (second @ abs_w), 0)
    mean_bound = (m + k) * U32 * (abs_x.mean(0) @ abs_w)
    assert np.all(np.abs(np.asarray(var, np.float64) - y64.var(0)) <= var_bound)
    assert np.all(np.abs(np.asarray(mean, np.float64) - y64.mean(0)) <= mean_bound)
    # The bound is a few % of the variance here (|w|^T |C| |w| ~ 40 w^T C w: mixed-sign weights
    # over positively correlated inputs): tight enough for a wrong formula to break it.
    assert np.all(var_bound < 5e-2 * y64.var(0))
