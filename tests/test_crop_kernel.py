"""jia_jax.crop_kernel: the windowed products against float64 numpy (run in Pallas'
interpreter on the CPU), that they never read the contraction outside a tile's span, and that
a span holds every nonzero weight of `crop_resize.axis_weights`."""

import jax
import jax.numpy as jnp
import numpy as np

from jia_jax import crop_kernel, crop_resize

U32 = 2.0**-24  # float32 unit roundoff


def test_span_holds_every_nonzero_weight_and_nothing_for_a_padding_tile():
    rng = np.random.default_rng(0)
    canvas, out = 64, 12
    length = rng.uniform(1.0, 60.0, 200).astype(np.float32)
    start = (rng.uniform(-2.0, 1.0, 200) * (canvas - length)).astype(np.float32)
    valid = rng.integers(1, canvas + 10, 200).astype(np.float32)
    start, length, valid = (np.append(v, 0.0).astype(np.float32) for v in (start, length, valid))
    weights = jax.vmap(lambda s, n, v: crop_resize.axis_weights(s, n, v, out, canvas))(
        start, length, valid)
    got = np.asarray(crop_kernel.span(jnp.asarray(start), jnp.asarray(length),
                                      jnp.asarray(valid), out, canvas))
    nonzero = np.asarray(weights).any(axis=1)
    for (low, high), row in zip(got, nonzero, strict=True):
        where = np.flatnonzero(row)
        assert 0 <= low <= high <= canvas
        if len(where):
            assert low <= where[0] and where[-1] < high
            assert high - low <= len(where) + 6  # not the whole canvas: the window and a margin
    np.testing.assert_array_equal(got[-1], [0, 0])  # no image: nothing to read


def _operands(seed: int = 0):
    """a [T, K, M] and weights [T, N, K] nonzero only on each tile's range of k (one tile with
    none, as a padding tile); the weights' last 4 rows zero, as padding to a power of two."""
    rng = np.random.default_rng(seed)
    t, k, m, n = 5, 64, 96, 16
    a = rng.normal(size=(t, k, m)).astype(np.float32)
    weights = rng.uniform(0.1, 1.0, size=(t, n, k)).astype(np.float32)
    weights[:, 12:] = 0.0
    ranges = np.array([(0, 64), (3, 17), (32, 64), (40, 41), (0, 0)], np.int32)
    for i, (lo, hi) in enumerate(ranges):
        weights[i, :, :lo] = 0.0
        weights[i, :, hi:] = 0.0
    return a, weights, ranges


def test_windowed_product_is_the_product_and_reads_only_the_span():
    a, weights, ranges = _operands()
    want = np.einsum("tkm,tnk->tmn", a.astype(np.float64), weights.astype(np.float64))
    terms = np.einsum("tkm,tnk->tmn", np.abs(a).astype(np.float64), weights.astype(np.float64))
    # Outside each tile's range (rounded out to the kernel's blocks of 16 along k), a holds NaN:
    # a product that read it would be NaN wherever its weight (0) met it.
    poisoned = a.copy()
    for i, (lo, hi) in enumerate(ranges):
        poisoned[i, : lo // 16 * 16] = np.nan
        poisoned[i, -(-hi // 16) * 16:] = np.nan
    blocks = crop_kernel.Blocks(m=32, n=16, k=16)
    out = crop_kernel.windowed_product(jnp.asarray(poisoned), jnp.asarray(weights),
                                       jnp.asarray(ranges), out_dtype=jnp.float32,
                                       blocks=blocks, interpret=True)
    assert out.shape == (5, 96, 16)
    out = np.asarray(out, np.float64)
    # 64 products summed in float32: at most 63 u of the sum of |terms| (a and the weights are
    # float32 already, so exact as loaded).
    assert np.all(np.abs(out - want) <= 63 * U32 * terms)
    assert np.all(out[..., 12:] == 0) and np.all(out[4] == 0)  # padding rows; no range


def test_uint8_operand_is_converted_as_loaded():
    rng = np.random.default_rng(1)
    a = rng.integers(0, 256, size=(2, 32, 32), dtype=np.uint8)
    weights = rng.uniform(0.0, 1.0, size=(2, 16, 32)).astype(np.float32)
    out = crop_kernel.windowed_product(jnp.asarray(a), jnp.asarray(weights),
                                       jnp.asarray([[0, 32], [0, 32]], np.int32),
                                       out_dtype=jnp.float32, interpret=True)
    want = np.einsum("tkm,tnk->tmn", a.astype(np.float64), weights.astype(np.float64))
    np.testing.assert_allclose(np.asarray(out), want, rtol=32 * U32)


def test_rows_not_wanted_are_zero_and_never_computed():
    a, weights, ranges = _operands()
    wanted = np.array([(0, 96), (32, 64), (0, 1), (95, 96), (0, 96)], np.int32)
    # NaN in the columns m of blocks (of 32) that miss a tile's wanted range: computing them
    # would leave NaN there instead of zeros.
    poisoned = a.copy()
    for i, (lo, hi) in enumerate(wanted):
        poisoned[i, :, : lo // 32 * 32] = np.nan
        poisoned[i, :, -(-hi // 32) * 32:] = np.nan
    out = crop_kernel.windowed_product(jnp.asarray(poisoned), jnp.asarray(weights),
                                       jnp.asarray(ranges), wanted=jnp.asarray(wanted),
                                       out_dtype=jnp.float32, interpret=True)
    out = np.asarray(out, np.float64)
    want = np.einsum("tkm,tnk->tmn", a.astype(np.float64), weights.astype(np.float64))
    terms = np.einsum("tkm,tnk->tmn", np.abs(a).astype(np.float64), weights.astype(np.float64))
    for i, (lo, hi) in enumerate(wanted):
        inside = np.zeros(96, bool)
        inside[lo // 32 * 32: -(-hi // 32) * 32] = True
        assert np.all(out[i, ~inside] == 0)
        assert np.all(np.abs(out[i, inside] - want[i, inside]) <= 63 * U32 * terms[i, inside])
