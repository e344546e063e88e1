"""A strided convolution computed exactly as a stride-1 convolution on a space-to-depth input.

A k x k convolution of stride s equals a ceil(k/s) x ceil(k/s) stride-1 convolution on the input
rearranged into s x s blocks of s*s*C channels, with the kernel zero-padded to a multiple of s and
rearranged the same way (the trick of the MLPerf ResNet-50 TPU submissions, there done in the
input pipeline). For ResNet's 7x7/2 stem on 3 channels: a 4x4 conv on 12 channels; 3 input
channels fill tensor-core tiles poorly, 12 do better, at 192/147 = 1.31x the multiply-adds (the
appended zero taps). Every product is one of the original conv's (or a product with an added
zero), so the function is the same up to summation order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax
from jax.typing import DTypeLike


def space_to_depth(x: jax.Array, block: int) -> jax.Array:
    """(N, H, W, C) -> (N, H/block, W/block, block*block*C), channel order (row, column, c)."""
    n, h, w, c = x.shape
    x = x.reshape(n, h // block, block, w // block, block, c)
    return x.transpose(0, 1, 3, 2, 4, 5).reshape(n, h // block, w // block, block * block * c)


def space_to_depth_kernel(kernel: jax.Array, block: int) -> jax.Array:
    """(kh, kw, C, O) -> (ceil(kh/block), ceil(kw/block), block*block*C, O), zero taps appended.

    Tap (i, j) of the result, channel (a, b, c), is the original tap (block*i + a, block*j + b) on
    channel c, the tap that meets the input pixel `space_to_depth` put there.
    """
    kh, kw, c, o = kernel.shape
    th, tw = -(-kh // block), -(-kw // block)
    kernel = jnp.pad(kernel, ((0, th * block - kh), (0, tw * block - kw), (0, 0), (0, 0)))
    kernel = kernel.reshape(th, block, tw, block, c, o).transpose(0, 2, 1, 3, 4, 5)
    return kernel.reshape(th, tw, block * block * c, o)


def conv_as_space_to_depth(
    x: jax.Array, kernel: jax.Array, stride: int, padding: Sequence[tuple[int, int]]
) -> jax.Array:
    """``lax.conv`` of NHWC ``x`` with HWIO ``kernel``, ``stride`` and explicit ``padding``.

    Output (row, column) r reads padded input rows stride*r .. stride*r + kh - 1, i.e. blocks
    r .. r + ceil(kh/stride) - 1 of the space-to-depth input; the input is padded (or cropped: a
    negative pad) to exactly the blocks the last output reads.
    """
    taps = [-(-k // stride) for k in kernel.shape[:2]]
    pads = []
    for size, k, t, (low, high) in zip(x.shape[1:3], kernel.shape[:2], taps, padding):
        out = (size + low + high - k) // stride + 1
        pads.append((low, stride * (out + t - 1) - size - low, 0))
    x = lax.pad(x, jnp.zeros((), x.dtype), ((0, 0, 0), *pads, (0, 0, 0)))
    return lax.conv_general_dilated(
        space_to_depth(x, stride),
        space_to_depth_kernel(kernel, stride),
        window_strides=(1, 1),
        padding="VALID",
        dimension_numbers=("NHWC", "HWIO", "NHWC"),
    )


class SpaceToDepthConv(nn.Module):
    """A bias-free strided `nn.Conv` (same parameter, same function), run as `conv_as_space_to_depth`.

    The parameter stays the (kh, kw, C, features) kernel, named ``kernel`` as `nn.Conv`'s, so
    checkpoints and parameter counts do not depend on the choice; the rearrangement happens at
    trace time, and its gradient flows back to the original taps.
    """

    features: int
    kernel_size: Sequence[int]
    strides: int
    padding: Sequence[tuple[int, int]]
    dtype: DTypeLike | None = None
    param_dtype: DTypeLike = jnp.float32
    kernel_init: Callable[..., jax.Array] = nn.initializers.lecun_normal()

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        """Applies the convolution to an NHWC batch; computes in ``dtype`` as `nn.Conv`."""
        kernel = self.param(
            "kernel",
            self.kernel_init,
            (*self.kernel_size, x.shape[-1], self.features),
            self.param_dtype,
        )
        x, kernel = nn.dtypes.promote_dtype(x, kernel, dtype=self.dtype)
        return conv_as_space_to_depth(x, kernel, self.strides, self.padding)
