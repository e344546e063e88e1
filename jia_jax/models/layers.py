"""Layer factories the models share."""

from __future__ import annotations

import functools
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.nn.initializers import Initializer

from jia_jax.models import batch_norm_ops
from jia_jax.models import max_pool as sliced
from jia_jax.models.conv import Conv
from jia_jax.models.space_to_depth import SpaceToDepthConv


class BatchNormAct(nn.BatchNorm):
    """flax BatchNorm, then ``+ residual``, then an optional ReLU.

    The batch statistics are one pass, shifted by a sample of each channel
    (`batch_norm_ops.moments`): flax's E[x^2] - E[x]^2 loses relative accuracy
    ~ 2^-24 * mean^2 / var in fp32, O(1) for a channel whose mean is ~4,000 standard deviations
    from zero (unnormalised inputs, a bias before the BN, drift in training); flax's two-pass form
    (``use_fast_variance=False``) is accurate but cost ResNet-50's plain step 9% on one H100
    (docs/benchmarks.md). Statistics across devices (``axis_name``; each device's shift differs,
    so their one-pass sums do not add up) and other axes take flax's own, two-pass. Either way
    the variables are `nn.BatchNorm`'s (names, shapes, dtypes), and autodiff gives the backward.
    """

    use_fast_variance: bool = False

    @nn.compact
    def __call__(
        self,
        x: jax.Array,
        residual: Callable[[], jax.Array] | None = None,
        *,
        relu: bool = False,
    ) -> jax.Array:
        """``relu(residual() + bn(x))``, the ReLU only if ``relu``, the add only with a residual.

        ``residual`` is a function (a ResNet shortcut, itself maybe a conv + BN), called after
        this BatchNorm, so the submodules are called in the order of the plain net, which
        `call_order` turns into the all-reduce's buckets.
        """
        y = self._plain(x) if self._one_pass_plain(x) else super().__call__(x)
        if residual is not None:
            y = residual() + y
        return nn.relu(y) if relu else y

    @nn.nowrap
    def _one_pass_plain(self, x: jax.Array) -> bool:
        """Whether `_plain` applies: per-device statistics of the last axis, scale and bias."""
        last = self.axis in (-1, x.ndim - 1)
        return self.axis_name is None and last and self.use_scale and self.use_bias

    @nn.nowrap
    def _variables(self, x: jax.Array):
        """nn.BatchNorm's variables (running mean and var, scale, bias) and the output dtype."""
        shape = (x.shape[-1],)
        stats_dtype = jnp.float32 if self.force_float32_reductions else self.param_dtype
        ra_mean = self.variable("batch_stats", "mean", lambda: jnp.zeros(shape, stats_dtype))
        ra_var = self.variable("batch_stats", "var", lambda: jnp.ones(shape, stats_dtype))
        scale = self.param("scale", self.scale_init, shape, self.param_dtype)
        bias = self.param("bias", self.bias_init, shape, self.param_dtype)
        dtype = nn.dtypes.canonicalize_dtype(x, scale, bias, dtype=self.dtype)
        return ra_mean, ra_var, scale, bias, dtype

    @nn.nowrap
    def _update_averages(self, ra_mean, ra_var, mean: jax.Array, var: jax.Array) -> None:
        if not self.is_initializing():  # as nn.BatchNorm: init leaves the running averages alone
            ra_mean.value = self.momentum * ra_mean.value + (1 - self.momentum) * mean
            ra_var.value = self.momentum * ra_var.value + (1 - self.momentum) * var

    def _plain(self, x: jax.Array) -> jax.Array:
        """nn.BatchNorm with per-device one-pass shifted statistics, differentiated by autodiff."""
        ra_mean, ra_var, scale, bias, dtype = self._variables(x)
        if self.use_running_average:
            mean, var = ra_mean.value, ra_var.value
        else:
            mean, var = batch_norm_ops.moments(x)
            self._update_averages(ra_mean, ra_var, *map(jax.lax.stop_gradient, (mean, var)))
        # nn.BatchNorm's normalisation (in the statistics' dtype, one cast to dtype): elementwise
        # given the statistics, so autodiff carries the batch statistics' gradient through them.
        return batch_norm_ops.batch_norm_eval(
            x, scale, bias, mean=mean, var=var, epsilon=self.epsilon, dtype=dtype
        )


def batch_norm(model: nn.Module, train: bool) -> Callable[..., BatchNormAct]:
    """`BatchNormAct` configured from `model`'s `bn_*`, `dtype` and `param_dtype` fields.

    flax BatchNorm (force_float32_reductions=True) computes mean/var, the running averages and the
    normalisation itself in fp32; `dtype` only sets the dtype of its output.
    """
    return functools.partial(
        BatchNormAct,
        use_running_average=not train,
        momentum=model.bn_momentum,
        epsilon=model.bn_epsilon,
        dtype=model.dtype,
        param_dtype=model.param_dtype,
        axis_name=model.bn_axis_name,
    )


def stem_conv(model: nn.Module, kernel_init: Initializer) -> Callable[..., nn.Module]:
    """The strided, bias-free stem conv: `nn.Conv`, or with `model.space_to_depth_stem` the same
    function and parameter as `SpaceToDepthConv`. Called as ``(features, kernel, stride, padding=)``.
    """
    if model.space_to_depth_stem:
        module = SpaceToDepthConv
    else:
        module = functools.partial(nn.Conv, use_bias=False)
    return functools.partial(
        module,
        dtype=model.dtype,
        param_dtype=model.param_dtype,
        kernel_init=kernel_init,
    )


def max_pool(model: nn.Module) -> Callable[..., jax.Array]:
    """`nn.max_pool`, or with `model.sliced_max_pool` the same function with the elementwise
    backward of `max_pool.py`. Called as ``(x, window_shape, strides, padding)``."""
    return sliced.max_pool if model.sliced_max_pool else nn.max_pool


def conv(model: nn.Module, kernel_init: Initializer) -> Callable[..., Conv]:
    """The models' bias-free convolution (`nn.Conv`'s function, the kernel stored in cuDNN's
    (out, h, w, in) order: `conv.py`) in `model`'s dtypes."""
    return functools.partial(
        Conv,
        dtype=model.dtype,
        param_dtype=model.param_dtype,
        kernel_init=kernel_init,
    )


def classifier(model: nn.Module, kernel_init: Initializer, name: str) -> nn.Dense:
    """The models' last layer: `model.num_classes` logits computed in fp32 whatever the compute
    dtype (a small share of the FLOPs; bf16 logits would lose bits the softmax loss uses)."""
    return nn.Dense(
        model.num_classes,
        dtype=jnp.float32,
        param_dtype=model.param_dtype,
        kernel_init=kernel_init,
        name=name,
    )
