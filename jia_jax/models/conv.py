"""A bias-free 2-D convolution of NHWC inputs whose kernel is stored (out, h, w, in).

flax's `nn.Conv` stores its kernel (h, w, in, out). For NHWC convolutions on tensor cores cuDNN
reads filters (out, h, w, in), so XLA transposes every kernel in each step: in the forward, fused
with the cast to the compute dtype, and every weight gradient back in the update. ResNet-50's
step on one H200 ran ~100 such transpose kernels, ~0.5 ms of kernel time at any batch size
(docs/benchmarks.md, "Conv kernels in cuDNN's layout"). Stored in cuDNN's order, the cast and the
update are plain elementwise passes.

The kernel takes the values `nn.Conv` would give it with the same initializer and key (drawn
(h, w, in, out), then transposed), so a model keeps its initial function and training.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.nn.initializers import Initializer

# lax.conv_general_dilated's names of the input, kernel and output dimensions.
DIMENSIONS = ("NHWC", "OHWI", "NHWC")
T = TypeVar("T")


def flax_order(dims: tuple[T, ...]) -> tuple[T, ...]:
    """A (out, h, w, in) kernel's per-axis `dims` (its shape, a partition spec) in the order
    `nn.Conv` stores the axes, as `to_flax_kernel` puts them: (h, w, in, out)."""
    return (*dims[1:], dims[0])


def to_flax_kernel(kernel: jax.Array) -> jax.Array:
    """A (out, h, w, in) kernel as `nn.Conv` stores it: (h, w, in, out)."""
    return jnp.transpose(kernel, (1, 2, 3, 0))


def from_flax_kernel(kernel: jax.Array) -> jax.Array:
    """An `nn.Conv` kernel (h, w, in, out) as `Conv` stores it: (out, h, w, in)."""
    return jnp.transpose(kernel, (3, 0, 1, 2))


class Conv(nn.Module):
    """`nn.Conv(features, kernel_size, strides, padding, use_bias=False)` on NHWC inputs, with
    the kernel stored (out, h, w, in). Called as ``(features, kernel_size, strides, padding=)``.

    Attributes:
      features: Output channels.
      kernel_size: (h, w) of the window.
      strides: One stride for both spatial axes, or (h, w).
      padding: ``"SAME"``, ``"VALID"`` or ((low, high), (low, high)) as `lax.conv_general_dilated`.
      dtype: The computation's dtype (None: from the input and kernel, as `nn.Conv`).
      param_dtype: The kernel's dtype.
      kernel_init: An initializer of (h, w, in, out) kernels, as `nn.Conv` takes.
    """

    features: int
    kernel_size: Sequence[int]
    strides: int | Sequence[int] = 1
    padding: str | Sequence[tuple[int, int]] = "SAME"
    dtype: jnp.dtype | None = None
    param_dtype: jnp.dtype = jnp.float32
    kernel_init: Initializer = nn.initializers.lecun_normal()

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        """The convolution of an NHWC batch, computed in ``dtype``."""
        kh, kw = self.kernel_size

        def init(key: jax.Array, shape: tuple[int, ...], dtype: jnp.dtype) -> jax.Array:
            return from_flax_kernel(self.kernel_init(key, flax_order(shape), dtype))

        kernel = self.param(
            "kernel", init, (self.features, kh, kw, x.shape[-1]), self.param_dtype
        )
        strides = (self.strides,) * 2 if isinstance(self.strides, int) else tuple(self.strides)
        x, kernel = nn.dtypes.promote_dtype(x, kernel, dtype=self.dtype)
        return jax.lax.conv_general_dilated(
            x, kernel, strides, self.padding, dimension_numbers=DIMENSIONS
        )
