"""The arithmetic of the models' BatchNorm: per-channel statistics and the normalisation.

`moments` computes each channel's mean and biased variance in one pass over ``x``, shifted by a
sample of the channel (Chan, Golub & LeVeque 1983), so that it keeps fp32 accuracy where flax's
unshifted one-pass form does not and costs one pass where flax's two-pass form costs two.
`batch_norm_eval` is flax's normalisation ``(x - mean) * rsqrt(var + epsilon) * scale + bias``,
computed in the statistics' dtype (at least fp32) and cast once to the output dtype, as
`nn.BatchNorm` with ``force_float32_reductions``. Both are plain jax: autodiff differentiates
them, so they hold under any transformation, `jax.shard_map` with replicated params included.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.typing import DTypeLike


def _stats_dtype(x: jax.Array) -> jnp.dtype:
    # At least fp32 (bf16 inputs are reduced in fp32), float64 stays float64.
    return jnp.promote_types(x.dtype, jnp.float32)


def moments(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Per-channel (last axis) mean and biased variance, both from one pass over ``x``.

    Shifted one-pass form (Chan, Golub & LeVeque 1983): with K = the first sample of each channel,
    mean = K + E[x - K] and var = E[(x - K)^2] - E[x - K]^2. Both sums are sibling reductions of
    one operand, which XLA fuses into one kernel. The unshifted E[x^2] - E[x]^2 (flax's
    use_fast_variance) loses relative accuracy ~ u * (mean^2 + var) / var, u the fp32 rounding of
    the sums (2^-24 times a slowly growing function of the ~3M-element ImageNet reduction): for a
    channel with |mean| = 100 std that is ~1e4 u ~ 1e-3, as large as the bf16 rounding (2^-8)
    of the output. With the shift the factor becomes 1 + (K - mean)^2 / var, whose expectation is
    2 for any mean, since K is a sample of the same channel; the bf16 input itself is exact in
    fp32, so the statistics are accurate to fp32 rounding whatever the channel's offset.

    Differentiable: the shift is held constant (it cancels from both results), so autodiff gives
    d mean/dx = 1/n and d var/dx = 2 (x - mean) / n with no gradient pass into the sample K.
    """
    cdt = _stats_dtype(x)
    axes = tuple(range(x.ndim - 1))
    n = math.prod(x.shape[:-1])
    xf = x.astype(cdt)
    shift = lax.stop_gradient(xf[(0,) * len(axes)])
    d = xf - shift
    mean_d = jnp.sum(d, axes) / n
    var = jnp.maximum(jnp.sum(d * d, axes) / n - mean_d * mean_d, 0.0)
    return shift + mean_d, var


def batch_norm_eval(
    x: jax.Array,
    scale: jax.Array,
    bias: jax.Array,
    *,
    mean: jax.Array,
    var: jax.Array,
    epsilon: float,
    dtype: DTypeLike,
) -> jax.Array:
    """BatchNorm of ``x`` (..., channels) with the given per-channel statistics.

    The statistics are the running averages in evaluation, the batch's (`moments`) in training;
    the expression is elementwise given them, so autodiff carries the gradient through them too.
    Computed in the wider of x's and the statistics' dtypes, at least fp32; cast once to ``dtype``.
    """
    cdt = jnp.promote_types(_stats_dtype(x), mean.dtype)
    mul = lax.rsqrt(var.astype(cdt) + epsilon) * scale.astype(cdt)
    y = (x.astype(cdt) - mean.astype(cdt)) * mul + bias.astype(cdt)
    return y.astype(dtype)
