"""Layer factories the models share."""

from __future__ import annotations

import functools
from collections.abc import Callable

import flax.linen as nn


def batch_norm(model: nn.Module, train: bool) -> Callable[..., nn.BatchNorm]:
    """BatchNorm configured from `model`'s `bn_*`, `dtype` and `param_dtype` fields.

    flax BatchNorm (force_float32_reductions=True) computes mean/var, the running averages and the
    normalisation itself in fp32; `dtype` only sets the dtype of its output.
    """
    return functools.partial(
        nn.BatchNorm,
        use_running_average=not train,
        momentum=model.bn_momentum,
        epsilon=model.bn_epsilon,
        dtype=model.dtype,
        param_dtype=model.param_dtype,
        axis_name=model.bn_axis_name,
    )
