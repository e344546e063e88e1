"""`scripts.bench.bn_reductions`: every variant it times computes the BatchNorm sums it names,
against float64 numpy (the Pallas kernel in Pallas's interpreter, on CPU)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scripts.bench import bn_reductions

U32 = 2.0**-24  # fp32 unit roundoff: the sums accumulate in fp32


def _inputs():
    keys = jax.random.split(jax.random.key(0), 3)
    shape = (4, 8, 8, 64)  # 256 rows of 64 channels, like the stem's per-image rows
    x, g, y = (jax.random.normal(k, shape, jnp.bfloat16) for k in keys)
    return x + 3, g, y  # an offset: the shift matters


def _check(got, want, terms):
    """Any order of summing n fp32 terms errs by at most (n - 1) u sum|terms| (Higham 4.3)."""
    n = terms[0].shape[0]
    for a, b, t in zip(got, want, (np.abs(terms[0]).sum(0), np.abs(terms[1]).sum(0))):
        assert np.all(np.abs(np.asarray(a, np.float64) - b) <= (n - 1) * U32 * t + 1e-30)


@pytest.mark.parametrize("variant", sorted(bn_reductions.VARIANTS))
def test_each_variant_computes_the_shifted_sums_and_the_relu_backward_sums(variant):
    x, g, y = _inputs()
    fwd, bwd = bn_reductions.VARIANTS[variant]
    if variant == "pallas":
        fwd = lambda a, f=fwd: f(a, block_rows=32, interpret=True)  # noqa: E731
        bwd = lambda *a, f=bwd: f(*a, block_rows=32, interpret=True)  # noqa: E731
    x64, g64, y64 = (np.asarray(v, np.float64).reshape(-1, 64) for v in (x, g, y))
    d = x64 - x64[0]
    _check(jax.jit(fwd)(x), (d.sum(0), (d * d).sum(0)), (d, d * d))
    dy = np.where(y64 > 0, g64, 0.0)
    _check(jax.jit(bwd)(g, y, x), (dy.sum(0), (dy * d).sum(0)), (dy, dy * d))
