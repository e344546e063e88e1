"""BatchNorm (+ residual add, + ReLU) with a hand-written backward, for fewer memory passes.

The training-mode function is a `jax.custom_vjp`:
  forward: the two statistics (sum and sum of squares) in one pass over ``x``, then
    ``relu((x - mean) * rstd * scale + bias + residual)`` as one elementwise expression;
  backward: the two reductions it needs, ``sum(g)`` and ``sum(g * xhat)`` with ``g`` the incoming
    gradient after the ReLU mask, in one pass, then the input gradient in one elementwise pass.
It saves ``x`` (in the compute dtype; ``xhat`` is recomputed inside the backward's passes instead
of stored in fp32), ``scale``, the per-channel mean and 1/std, and (with the ReLU) the output,
whose sign is the ReLU mask; the output is the next convolution's input, kept anyway.

Semantics are flax's `nn.BatchNorm` (force_float32_reductions) followed by ``nn.relu(residual +
y)``: statistics, normalisation and the running averages in at least fp32, output in the compute
dtype. The differences are rounding only: the add and the ReLU happen before the single cast to
the compute dtype, where the plain layers round the BN output first and the sum again; and the
one-pass variance is shifted (`moments`), more accurate than flax's for offset channels.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.typing import DTypeLike


def _stats_dtype(x: jax.Array) -> jnp.dtype:
    # At least fp32 (bf16 inputs are reduced in fp32), float64 stays float64.
    return jnp.promote_types(x.dtype, jnp.float32)


def _apply(
    x: jax.Array,
    mean: jax.Array,
    mul: jax.Array,
    bias: jax.Array,
    residual: jax.Array | None,
    relu: bool,
    dtype: DTypeLike,
) -> jax.Array:
    """``relu((x - mean) * mul + bias + residual)`` in the statistics' dtype, cast once to dtype."""
    z = (x.astype(mean.dtype) - mean) * mul + bias.astype(mean.dtype)
    if residual is not None:
        z = z + residual.astype(mean.dtype)
    if relu:
        # nn.relu, not jnp.maximum: its gradient at exactly 0 is 0, as the plain layers'.
        z = jax.nn.relu(z)
    return z.astype(dtype)


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


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def _train(
    x: jax.Array,
    scale: jax.Array,
    bias: jax.Array,
    residual: jax.Array | None,
    has_residual: bool,
    epsilon: float,
    relu: bool,
    dtype: jnp.dtype,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    return _train_fwd(x, scale, bias, residual, has_residual, epsilon, relu, dtype)[0]


def _train_fwd(x, scale, bias, residual, has_residual, epsilon, relu, dtype):
    del has_residual
    mean, var = moments(x)
    rstd = lax.rsqrt(var + epsilon)
    y = _apply(x, mean, rstd * scale.astype(mean.dtype), bias, residual, relu, dtype)
    return (y, mean, var), (x, scale, mean, rstd, y if relu else None)


def _train_bwd(has_residual, epsilon, relu, dtype, saved, cotangents):
    del epsilon
    x, scale, mean, rstd, y = saved
    # The statistics are returned under stop_gradient (`batch_norm_train`): only dy flows back.
    dy = cotangents[0]
    cdt = mean.dtype
    g = dy.astype(cdt)
    if relu:
        g = jnp.where(y > 0, g, 0.0)
    axes = tuple(range(x.ndim - 1))
    n = math.prod(x.shape[:-1])
    xhat = (x.astype(cdt) - mean) * rstd
    sum_g = jnp.sum(g, axes)
    sum_g_xhat = jnp.sum(g * xhat, axes)
    # d/dx of the normalisation with the batch statistics (Ioffe & Szegedy 2015, sec. 3).
    dx = (scale.astype(cdt) * rstd) * (g - sum_g / n - xhat * (sum_g_xhat / n))
    d_residual = g.astype(dtype) if has_residual else None
    return (
        dx.astype(x.dtype),
        sum_g_xhat.astype(scale.dtype),
        sum_g.astype(scale.dtype),  # bias shares scale's param_dtype
        d_residual,
    )


_train.defvjp(_train_fwd, _train_bwd)


def batch_norm_train(
    x: jax.Array,
    scale: jax.Array,
    bias: jax.Array,
    residual: jax.Array | None = None,
    *,
    epsilon: float,
    relu: bool,
    dtype: DTypeLike,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """BatchNorm with the batch's statistics over all axes but the last, + residual, + ReLU.

    Args:
      x: Input, (..., channels), normalised per channel.
      scale: Per-channel gamma.
      bias: Per-channel beta.
      residual: Added after the normalisation and before the ReLU (the shape of ``x``, cast to
        ``dtype`` as the plain layers' sum has it), or None.
      epsilon: Added to the variance.
      relu: Apply a ReLU last.
      dtype: Dtype of the output.

    Returns:
      ``(y, mean, var)``: the output, and the batch mean and biased variance (in at least fp32,
      under stop_gradient: they feed the running averages, not the loss).
    """
    dtype = jnp.dtype(dtype)
    has_residual = residual is not None
    residual = residual.astype(dtype) if has_residual else None
    y, mean, var = _train(x, scale, bias, residual, has_residual, epsilon, relu, dtype)
    return y, lax.stop_gradient(mean), lax.stop_gradient(var)


def batch_norm_eval(
    x: jax.Array,
    scale: jax.Array,
    bias: jax.Array,
    residual: jax.Array | None = None,
    *,
    mean: jax.Array,
    var: jax.Array,
    epsilon: float,
    relu: bool,
    dtype: DTypeLike,
) -> jax.Array:
    """BatchNorm with given (running) statistics, + residual, + ReLU, as one elementwise expression.

    Elementwise only, so autodiff's backward is one elementwise pass too: no custom VJP needed.
    """
    cdt = jnp.promote_types(_stats_dtype(x), mean.dtype)
    mean = mean.astype(cdt)
    mul = lax.rsqrt(var.astype(cdt) + epsilon) * scale.astype(cdt)
    residual = None if residual is None else residual.astype(dtype)
    return _apply(x, mean, mul, bias, residual, relu, dtype)
