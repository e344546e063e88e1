"""jia_jax.crop_kernel: the windowed products against float64 numpy (run in Pallas'
interpreter on the CPU), that a block of output rows never reads the contraction outside its
rows' spans, and that a row's span holds every nonzero weight of `crop_resize.axis_weights`."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jia_jax import crop_kernel, crop_resize

U32 = 2.0**-24  # float32 unit roundoff


@pytest.mark.parametrize("flip", [False, True])
def test_row_spans_hold_every_nonzero_weight_and_nothing_for_a_padding_tile(flip):
    rng = np.random.default_rng(0)
    canvas, out, rows = 64, 12, 16
    length = rng.uniform(1.0, 60.0, 200).astype(np.float32)
    start = (rng.uniform(-2.0, 1.0, 200) * (canvas - length)).astype(np.float32)
    valid = rng.integers(1, canvas + 10, 200).astype(np.float32)
    start, length, valid = (np.append(v, 0.0).astype(np.float32) for v in (start, length, valid))
    weights = jax.vmap(lambda s, n, v: crop_resize.axis_weights(s, n, v, out, canvas, rows,
                                                                flip=flip))(start, length, valid)
    got = np.asarray(crop_kernel.row_spans(jnp.asarray(start), jnp.asarray(length),
                                           jnp.asarray(valid), out, canvas, rows,
                                           flip=jnp.full(len(start), flip)))
    assert got.shape == (len(start), rows, 2)
    for tile_spans, tile_weights, scale in zip(got, np.asarray(weights), length / out,
                                               strict=True):
        for (low, high), row in zip(tile_spans, tile_weights, strict=True):
            where = np.flatnonzero(row)
            if not len(where):
                continue
            assert 0 <= low and where[0] >= low and where[-1] < high <= canvas
            # The support's width and a pixel of margin each side, not the whole window.
            assert high - low <= 2 * max(scale, 1.0) + 5
    assert np.all(got[:, out:, 0] >= got[:, out:, 1])  # rows past the samples: empty
    assert np.all(got[-1, :, 0] >= got[-1, :, 1])  # no image: nothing to read


def test_hull_holds_the_ranges_and_is_empty_only_when_all_are():
    spans = jnp.asarray([[[3, 9], [5, 12], [64, 0]], [[64, 0], [64, 0], [64, 0]]], jnp.int32)
    got = np.asarray(crop_kernel.hull(spans))
    np.testing.assert_array_equal(got[0], [3, 12])
    assert got[1, 0] >= got[1, 1]


def _operands(seed: int = 0):
    """a [T, K, M] and weights [T, N, K], row n of tile t nonzero only on its range of k (a band
    moving down k with n, as a resize's; one tile with none, as a padding tile); the weights'
    last 4 rows zero and empty, as padding to a power of two."""
    rng = np.random.default_rng(seed)
    t, k, m, n = 5, 64, 96, 16
    a = rng.normal(size=(t, k, m)).astype(np.float32)
    weights = rng.uniform(0.1, 1.0, size=(t, n, k)).astype(np.float32)
    # Per tile: where row 0's range starts, how far each row moves, and its width.
    bands = [(0, 4, 10), (3, 1, 6), (32, 2, 8), (40, 0, 1), (0, 0, 0)]
    ranges = np.zeros((t, n, 2), np.int32)
    for i, (first, stride, width) in enumerate(bands):
        for row in range(n):
            low = min(first + row * stride, k)
            ranges[i, row] = (low, min(low + width, k)) if row < 12 else (k, 0)
            weights[i, row, : ranges[i, row, 0]] = 0.0
            weights[i, row, max(ranges[i, row, 1], ranges[i, row, 0]):] = 0.0
    return a, weights, ranges


def test_windowed_product_is_the_product_and_a_row_block_reads_only_its_band():
    a, weights, ranges = _operands()
    want = np.einsum("tkm,tnk->tmn", a.astype(np.float64), weights.astype(np.float64))
    terms = np.einsum("tkm,tnk->tmn", np.abs(a).astype(np.float64), weights.astype(np.float64))
    blocks = crop_kernel.Blocks(m=32, n=4, k=16)
    # Rows n in blocks of 4: a copy of a holding NaN outside a block's band (its rows' ranges'
    # hull, rounded out to the kernel's blocks of 16 along k) is read for that block's outputs;
    # a kernel that read there would be NaN wherever its weight (0) met it.
    out = np.zeros(want.shape)
    for block in range(4):
        rows = ranges[:, 4 * block: 4 * block + 4]
        poisoned = a.copy()
        for i, (lo, hi) in enumerate(zip(rows[..., 0].min(1), rows[..., 1].max(1))):
            if lo >= hi:
                poisoned[i] = np.nan
                continue
            poisoned[i, : lo // 16 * 16] = np.nan
            poisoned[i, -(-hi // 16) * 16:] = np.nan
        got = crop_kernel.windowed_product(jnp.asarray(poisoned), jnp.asarray(weights),
                                           jnp.asarray(ranges), out_dtype=jnp.float32,
                                           blocks=blocks, interpret=True)
        assert got.shape == (5, 96, 16)
        out[..., 4 * block: 4 * block + 4] = np.asarray(got)[..., 4 * block: 4 * block + 4]
    # 64 products summed in float32: at most 63 u of the sum of |terms| (a and the weights are
    # float32 already, so exact as loaded).
    assert np.all(np.abs(out - want) <= 63 * U32 * terms)
    assert np.all(out[..., 12:] == 0) and np.all(out[4] == 0)  # padding rows; no range


def test_uint8_operand_is_converted_as_loaded():
    rng = np.random.default_rng(1)
    a = rng.integers(0, 256, size=(2, 32, 32), dtype=np.uint8)
    weights = rng.uniform(0.0, 1.0, size=(2, 16, 32)).astype(np.float32)
    out = crop_kernel.windowed_product(jnp.asarray(a), jnp.asarray(weights),
                                       jnp.asarray(np.tile([0, 32], (2, 16, 1)), np.int32),
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


def test_the_crop_program_lowers_its_kernels_to_triton_for_cuda():
    """The GPU's Pallas (Triton) lowering runs here, without a GPU: an op the Triton lowering
    lacks, or a block shape it refuses, fails here instead of on the first GPU run. Both
    products become Triton kernels; XLA's CPU-side interpreter is not involved."""
    from jax import export  # noqa: PLC0415

    batch = 4
    program = jax.jit(functools.partial(crop_resize.crop_resize, batch=batch, image_size=224,
                                        one_tile_each=True, kernel="pallas"))
    triton = "__gpu$xla.gpu.triton"
    lowered = export.export(
        program, platforms=["cuda"],
        disabled_checks=[export.DisabledSafetyCheck.custom_call(triton)],
    )(jax.ShapeDtypeStruct((batch, 512, 512, 3), jnp.uint8),
      jax.ShapeDtypeStruct((batch,), jnp.int32),
      jax.ShapeDtypeStruct((batch, crop_resize.NUM_PARAMS), jnp.float32))
    assert lowered.mlir_module().count(f"custom_call @{triton}") == 2


def test_pixels_round_to_nearest_ties_to_even_and_clip_as_numpy():
    """`to_pixels` (by floor, which Triton lowers) against numpy's round half to even: ties of
    both parities, the floats next to them, the clip at both ends."""
    ties = np.arange(-2, 258, dtype=np.float32) + np.float32(0.5)
    near = np.concatenate([np.nextafter(ties, np.float32(-1e9)),
                           np.nextafter(ties, np.float32(1e9))])
    rng = np.random.default_rng(5)
    sums = np.concatenate([ties, near, rng.uniform(-300, 600, 4000).astype(np.float32),
                           np.float32([0, 255, -0.0, 1e6, -1e6])])
    want = np.clip(np.round(sums), 0, 255).astype(np.uint8)
    np.testing.assert_array_equal(np.asarray(crop_kernel.to_pixels(jnp.asarray(sums))), want)


def test_a_uint8_product_is_the_float32_one_rounded_to_pixels():
    """The kernel rounding its sums (out_dtype uint8) gives, bit for bit, what rounding its
    float32 output after gives; weights of 0.5 on integer pixels make exact ties."""
    rng = np.random.default_rng(6)
    a = rng.integers(0, 256, size=(2, 32, 32), dtype=np.uint8)
    weights = np.where(rng.uniform(size=(2, 16, 32)) < 0.1, 0.5, 0.0).astype(np.float32)
    weights[1] = rng.uniform(0.0, 0.2, size=(16, 32))
    spans = jnp.asarray(np.tile([0, 32], (2, 16, 1)), np.int32)
    product = functools.partial(crop_kernel.windowed_product, jnp.asarray(a),
                                jnp.asarray(weights), spans, interpret=True)
    sums = np.asarray(product(out_dtype=jnp.float32))
    assert np.any(sums[0] % 1 == 0.5) and np.any(sums > 255)  # ties and clipped sums occur
    got = product(out_dtype=jnp.uint8)
    assert got.dtype == jnp.uint8
    np.testing.assert_array_equal(np.asarray(got), np.clip(np.round(sums), 0, 255))
