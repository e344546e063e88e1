"""Max-pooling whose backward is one elementwise pass instead of XLA's select-and-scatter.

`flax.linen.max_pool` is a `lax.reduce_window`; its gradient is a select-and-scatter, which XLA's
GPU backend runs as a slow scatter (measured as the max-pool kernels of ResNet-50's step). Here the
forward takes the maximum over the window's taps, each tap a strided slice of the padded input,
and keeps which tap won (one byte per output); in the backward each input gathers the cotangents
of the (at most ceil(k/s)^2) windows it won, read from a nearest-neighbour upsampling of the
output: one elementwise kernel over the input, which XLA fuses into the BatchNorm backward before.

Ties: the gradient goes to the first maximum in row-major window order (top row first, left to
right), the input XLA's select-and-scatter picks for `reduce_window`'s gradient (its select is
`>=` on the current choice, so a later equal tap never replaces it). The function and its gradient
are flax's, up to the order of the (at most ceil(k/s)^2) additions where windows overlap, which
here run in fp32 (float64 for float64) and are rounded once to the input's dtype.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax import lax

Padding = Sequence[tuple[int, int]]


def _geometry(
    shape: Sequence[int], window: Sequence[int], strides: Sequence[int], padding: Padding
) -> list[tuple[int, int, int, int, int]]:
    """Per spatial axis: (size, window, stride, low pad, outputs)."""
    axes = []
    for size, k, s, (low, high) in zip(shape[1:3], window, strides, padding, strict=True):
        if low < 0 or high < 0 or size + low + high < k:
            raise ValueError(f"max_pool: padding {padding} does not fit a {k}-wide window")
        axes.append((size, k, s, low, (size + low + high - k) // s + 1))
    return axes


def _taps(x: jax.Array, window, strides, padding):
    """The window's taps in row-major order: each the strided slice of the -inf-padded input
    that the tap meets, of the output's shape."""
    (_, kh, sh, _, oh), (_, kw, sw, _, ow) = _geometry(x.shape, window, strides, padding)
    pads = ((0, 0, 0), *((lo, hi, 0) for lo, hi in padding), (0, 0, 0))
    xp = lax.pad(x, jnp.array(-jnp.inf, x.dtype), pads)
    n, c = x.shape[0], x.shape[3]

    def tap(i: int, j: int) -> jax.Array:
        end = (n, i + sh * (oh - 1) + 1, j + sw * (ow - 1) + 1, c)
        return lax.slice(xp, (0, i, j, 0), end, (1, sh, sw, 1))

    return [tap(i, j) for i in range(kh) for j in range(kw)]


def _forward(x, window, strides, padding):
    taps = _taps(x, window, strides, padding)
    best, winner = taps[0], jnp.zeros(taps[0].shape, jnp.uint8)
    for t, tap in enumerate(taps[1:], start=1):
        later = tap > best  # strict: an equal later tap leaves the first maximum chosen
        best = jnp.where(later, tap, best)
        winner = jnp.where(later, jnp.uint8(t), winner)
    return best, winner


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3))
def _max_pool(x, window, strides, padding):
    return _forward(x, window, strides, padding)[0]


def _max_pool_fwd(x, window, strides, padding):
    y, winner = _forward(x, window, strides, padding)
    # The input's shape, as a residual of no bytes (residuals are arrays, not Python values).
    return y, (winner, jnp.zeros((*x.shape[:3], 0), x.dtype))


def _spread(a: jax.Array, axis: int, stride: int, back: int, low: int, size: int) -> jax.Array:
    """``a`` indexed by input position along ``axis``: at padded position P = low + p (p < size)
    it holds ``a[P // stride - back]``, or 0 where that output does not exist."""
    outputs = a.shape[axis]
    spread = jnp.repeat(a, stride, axis=axis)  # P -> a[P // stride], P < stride * outputs
    # Shift by `back` outputs, then keep the input's positions (lax.pad crops where negative).
    pads = [(0, 0, 0)] * a.ndim
    pads[axis] = (stride * back - low, low + size - stride * (outputs + back), 0)
    return lax.pad(spread, jnp.zeros((), a.dtype), pads)


def _max_pool_bwd(window, strides, padding, residuals, g):
    """Each input gathers the cotangents of the windows whose winner it is.

    Along an axis, padded input P lies in the windows o = P // s - m (m = 0 .. ceil(k/s) - 1) at
    tap P % s + s m, where that tap is < k and o exists: so each input sums at most
    ceil(kh/sh) ceil(kw/sw) masked cotangents (4 for ResNet's 3x3/2), read at positions that are a
    nearest-neighbour upsampling of the output: one elementwise pass over the input, no scatter
    and no interior padding (which fused into the BN backward cost the stem's pass ~4x its bytes).
    """
    winner, like = residuals
    shape = (*like.shape[:3], g.shape[3])
    (h, kh, sh, lo_h, _), (w, kw, sw, lo_w, _) = _geometry(shape, window, strides, padding)
    # Overlapping windows add in at least fp32, rounded once to the dtype below.
    acc = jnp.promote_types(g.dtype, jnp.float32)
    g_acc = g.astype(acc)
    rows = lax.broadcasted_iota(jnp.int32, (1, h, 1, 1), 1) + lo_h
    cols = lax.broadcasted_iota(jnp.int32, (1, 1, w, 1), 2) + lo_w
    dx = jnp.zeros(shape, acc)
    for mh in range(-(-kh // sh)):
        tap_h = rows % sh + sh * mh
        g_h, win_h = (_spread(a, 1, sh, mh, lo_h, h) for a in (g_acc, winner))
        for mw in range(-(-kw // sw)):
            tap_w = cols % sw + sw * mw
            mine = (tap_h < kh) & (tap_w < kw)
            mine &= _spread(win_h, 2, sw, mw, lo_w, w) == (tap_h * kw + tap_w).astype(winner.dtype)
            dx += jnp.where(mine, _spread(g_h, 2, sw, mw, lo_w, w), 0)
    return (dx.astype(g.dtype),)


_max_pool.defvjp(_max_pool_fwd, _max_pool_bwd)


def max_pool(
    x: jax.Array,
    window_shape: Sequence[int],
    strides: Sequence[int],
    padding: str | Padding = "VALID",
) -> jax.Array:
    """`flax.linen.max_pool` of an NHWC batch (same arguments, floating dtypes), with the
    elementwise backward of this module; ties send the gradient to the first maximum in
    row-major window order, as flax's.

    Args:
      x: (batch, height, width, channels), a floating dtype (padding is -inf).
      window_shape: (kh, kw).
      strides: (sh, sw).
      padding: "VALID" or ((top, bottom), (left, right)), non-negative.
    """
    if padding == "VALID":
        padding = ((0, 0), (0, 0))
    if not jnp.issubdtype(x.dtype, jnp.floating) or x.ndim != 4:
        raise ValueError(f"max_pool takes a floating NHWC batch, got {x.dtype}{list(x.shape)}")
    if window_shape[0] * window_shape[1] > 256:
        raise ValueError("max_pool keeps the winning tap in a byte: windows of at most 256 taps")
    padding = tuple((int(lo), int(hi)) for lo, hi in padding)
    return _max_pool(x, tuple(window_shape), tuple(strides), padding)
