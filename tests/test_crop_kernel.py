"""jia_jax.crop_kernel: the windowed products against float64 numpy (run in Pallas'
interpreter on the CPU), that a block of output rows never reads the contraction outside its
rows' spans, and that a row's span holds every nonzero weight of its taps (resize_filter)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jia_jax import crop_kernel, crop_resize, resize_filter
from tests.test_resize_filter import dense64

U32 = 2.0**-24  # float32 unit roundoff


@pytest.mark.parametrize("flip", [False, True])
def test_row_spans_hold_every_nonzero_weight_and_nothing_for_a_padding_tile(flip):
    rng = np.random.default_rng(0)
    canvas, out, rows = 64, 12, 16
    length = rng.uniform(1.0, 60.0, 200).astype(np.float32)
    start = (rng.uniform(-2.0, 1.0, 200) * (canvas - length)).astype(np.float32)
    valid = rng.integers(1, canvas + 10, 200).astype(np.float32)
    start, length, valid = (np.append(v, 0.0).astype(np.float32) for v in (start, length, valid))
    taps = resize_filter.axis_taps(jnp.asarray(start), jnp.asarray(length), jnp.asarray(valid),
                                   out, rows, flip=jnp.full(len(start), flip))
    weights = np.asarray(resize_filter.weights(taps, canvas))
    got = np.asarray(crop_kernel.row_spans(taps, canvas))
    assert got.shape == (len(start), rows, 2)
    for tile_spans, tile_weights, scale in zip(got, weights, length / out, strict=True):
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


def _taps(centre, support, valid, scale) -> np.ndarray:
    """float32 [T, NUM_TAPS, N] from per-row arrays [T, N] (or per-tile [T, 1])."""
    shape = np.broadcast_shapes(*(np.shape(v) for v in (centre, support, valid, scale)))
    order = sorted([(resize_filter.CENTRE, centre), (resize_filter.SUPPORT, support),
                    (resize_filter.VALID, valid), (resize_filter.SCALE, scale)])
    return np.stack([np.broadcast_to(v, shape) for _, v in order], axis=1).astype(np.float32)


def _weights64(taps: np.ndarray, count: int) -> np.ndarray:
    """float64 [T, N, count]: the triangle filter of `taps` at pixels 0..count-1, in numpy."""
    centre, support, valid, scale = (taps[:, q].astype(np.float64) for q in (
        resize_filter.CENTRE, resize_filter.SUPPORT, resize_filter.VALID, resize_filter.SCALE))
    return dense64(centre, support, valid, count) * scale[..., None]


def _weight_error(taps: np.ndarray, count: int) -> np.ndarray:
    """[T, N, count]: a bound on each float32 weight's error: the position, its distance to the
    centre and the quotient each rounded once (a few u of the larger of position and centre over
    the support), 1 - that and the scale once more each."""
    centre, support, _, scale = (np.abs(taps[:, q, :, None]).astype(np.float64) for q in range(4))
    pixel = np.arange(count, dtype=np.float64) + 0.5
    return 8 * U32 * scale * (1.0 + (pixel + centre) / support)


def _operands(seed: int = 0):
    """a [T, K, M] and taps [T, NUM_TAPS, N]: per tile a resize's rows, centres moving down k
    with n at its scale, its valid pixels ending inside or past k (one tile with none, as a
    padding tile); the last 4 rows of scale 0, as padding to a power of two."""
    rng = np.random.default_rng(seed)
    t, k, m, n = 5, 64, 96, 16
    a = rng.normal(size=(t, k, m)).astype(np.float32)
    # Per tile: row 0's centre, the step between rows' centres (the scale), valid pixels.
    bands = [(1.0, 4.0, 64), (3.3, 1.0, 50), (32.7, 2.5, 64), (40.2, 0.4, 45), (0.0, 1.0, 0)]
    centre = np.array([[c + row * step for row in range(n)] for c, step, _ in bands])
    support = np.array([[max(step, 1.0)] for _, step, _ in bands])
    valid = np.array([[v] for _, _, v in bands], np.float64)
    scale = np.where(np.arange(n) < 12, rng.uniform(0.1, 1.0, (t, n)), 0.0)
    return a, _taps(centre, support, valid, scale)


def _product(a, taps, **kwargs):
    return crop_kernel.windowed_product(jnp.asarray(a), jnp.asarray(taps), interpret=True,
                                        **{"dtype": jnp.float32, "out_dtype": jnp.float32,
                                           **kwargs})


def _reference(a, taps):
    """The product in float64 and a bound on the kernel's error: 64 float32 products summed (at
    most 63 u of the sum of |terms|), and each weight's own error times |a|."""
    k = a.shape[1]
    a64 = a.astype(np.float64)
    want = np.einsum("tkm,tnk->tmn", a64, _weights64(taps, k))
    terms = np.einsum("tkm,tnk->tmn", np.abs(a64), _weights64(taps, k))
    slack = np.einsum("tkm,tnk->tmn", np.abs(a64), _weight_error(taps, k))
    return want, 63 * U32 * terms + slack


def test_windowed_product_is_the_product_and_a_row_block_reads_only_its_band():
    a, taps = _operands()
    want, bound = _reference(a, taps)
    spans = np.asarray(crop_kernel.row_spans(jnp.asarray(taps), a.shape[1]))
    blocks = crop_kernel.Blocks(m=32, n=4, k=16)
    # Rows n in blocks of 4: a copy of a holding NaN outside a block's band (its rows' spans'
    # hull, rounded out to the kernel's blocks of 16 along k) is read for that block's outputs;
    # a kernel that read there would be NaN wherever its weight (0) met it.
    out = np.zeros(want.shape)
    for block in range(4):
        rows = spans[:, 4 * block: 4 * block + 4]
        poisoned = a.copy()
        for i, (lo, hi) in enumerate(zip(rows[..., 0].min(1), rows[..., 1].max(1))):
            if lo >= hi:
                poisoned[i] = np.nan
                continue
            poisoned[i, : lo // 16 * 16] = np.nan
            poisoned[i, -(-hi // 16) * 16:] = np.nan
        got = _product(poisoned, taps, blocks=blocks)
        assert got.shape == (5, 96, 16)
        out[..., 4 * block: 4 * block + 4] = np.asarray(got)[..., 4 * block: 4 * block + 4]
    assert np.all(np.abs(out - want) <= bound)
    assert np.abs(out - want).max() > 0  # float32 arithmetic, not float64
    assert np.all(out[..., 12:] == 0) and np.all(out[4] == 0)  # padding rows; no image


def test_weights_are_rounded_to_dtype_and_uint8_converted_as_loaded():
    """uint8 pixels and bfloat16 weights: within the weights' rounding (bfloat16's unit
    roundoff, 2^-8) of the float64 product, and within float32 summation (32 u) of the float64
    product of `resize_filter.weights` rounded to bfloat16: the kernel's weights are those."""
    rng = np.random.default_rng(1)
    a = rng.integers(0, 256, size=(2, 32, 32), dtype=np.uint8)
    taps = _taps(rng.uniform(0, 32, (2, 16)), rng.uniform(1, 4, (2, 16)), [[32], [20]],
                 rng.uniform(0.2, 1.0, (2, 16)))
    got = np.asarray(_product(a, taps, dtype=jnp.bfloat16), np.float64)
    want, bound = _reference(a.astype(np.float32), taps)
    terms = np.einsum("tkm,tnk->tmn", a.astype(np.float64), _weights64(taps, 32))
    assert np.all(np.abs(got - want) <= bound + 2**-8 * terms)
    assert np.abs(got - want).max() > 1e-3  # the weights were rounded
    rounded = jnp.asarray(resize_filter.weights(jnp.asarray(taps), 32)).astype(jnp.bfloat16)
    exact = np.einsum("tkm,tnk->tmn", a.astype(np.float64), np.asarray(rounded, np.float64))
    np.testing.assert_allclose(got, exact, rtol=32 * U32)


def test_rows_not_wanted_are_neither_computed_nor_written():
    """Blocks of m (of 32) missing a tile's wanted range stay as the interpreter leaves an
    output it never wrote (NaN): a kernel that computed them, from the large but finite numbers
    placed there, or wrote zeros, would leave finite numbers. Blocks meeting it: the product."""
    a, taps = _operands()
    wanted = np.array([(0, 96), (32, 64), (0, 1), (95, 96), (0, 96)], np.int32)
    poisoned = a.copy()
    for i, (lo, hi) in enumerate(wanted):
        poisoned[i, :, : lo // 32 * 32] = 1e6
        poisoned[i, :, -(-hi // 32) * 32:] = 1e6
    out = np.asarray(_product(poisoned, taps, wanted=jnp.asarray(wanted)), np.float64)
    want, bound = _reference(a, taps)
    for i, (lo, hi) in enumerate(wanted):
        inside = np.zeros(96, bool)
        inside[lo // 32 * 32: -(-hi // 32) * 32] = True
        assert np.all(np.isnan(out[i, ~inside]))
        assert np.all(np.abs(out[i, inside] - want[i, inside]) <= bound[i, inside])


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
    float32 output after gives; a support of 2 centred on pixels weighs their neighbours 0.5,
    which makes exact ties."""
    rng = np.random.default_rng(6)
    a = rng.integers(0, 256, size=(2, 32, 32), dtype=np.uint8)
    centre = np.stack([rng.integers(0, 32, 16) + 0.5, rng.uniform(0, 32, 16)])
    taps = _taps(centre, [[2.0], [3.0]], [[32], [32]], [[1.0], [0.4]])
    sums = np.asarray(_product(a, taps))
    assert np.any(sums[0] % 1 == 0.5) and np.any(sums > 255)  # ties and clipped sums occur
    got = _product(a, taps, out_dtype=jnp.uint8)
    assert got.dtype == jnp.uint8
    np.testing.assert_array_equal(np.asarray(got), np.clip(np.round(sums), 0, 255))
