"""Max-pooling whose backward is one elementwise pass instead of XLA's select-and-scatter.

`flax.linen.max_pool` is a `lax.reduce_window`; its gradient is a select-and-scatter, which XLA's
GPU backend runs as a slow scatter (measured as the max-pool kernels of ResNet-50's step). Here the
forward takes the maximum over the window's taps, each tap a strided slice of the padded input,
and keeps which tap won (one byte per output); in the backward each input gathers the cotangents
of the (at most ceil(k/s)^2) windows it won, by residue class of its position modulo the stride:
one elementwise kernel over the input, which XLA fuses into the BatchNorm backward before.

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


def _max_pool_bwd(window, strides, padding, residuals, g):
    """Each input gathers the cotangents of the windows whose winner it is, by residue class.

    Along an axis, padded input P = s a + r (r < s) lies in the windows o = a - m
    (m = 0 .. ceil(k/s) - 1) at tap r + s m, where that tap is < k and o exists. So for each
    residue class (r_h, r_w) the gradient is a sum of at most ceil(kh/sh) ceil(kw/sw) masked
    cotangents read at a fixed shift (4 terms for ResNet's 3x3/2, 1 for the even-even class), and
    the classes interleave into the input by a reshape: one elementwise pass, no scatter and no
    interior padding (whose index arithmetic made the stem's BN backward compute-bound).
    """
    winner, like = residuals
    n, h, w = like.shape[:3]
    (_, kh, sh, lo_h, oh), (_, kw, sw, lo_w, ow) = _geometry(like.shape, window, strides, padding)
    mh, mw = -(-kh // sh), -(-kw // sw)  # windows per input, per axis
    rows, cols = -(-(lo_h + h) // sh), -(-(lo_w + w) // sw)  # the blocks a, b the input spans
    # Overlapping windows add in at least fp32, rounded once to the dtype below.
    acc = jnp.promote_types(g.dtype, jnp.float32)
    # Padded so that [m' : m' + rows] with m' = mh - 1 - m holds output a - m (zero if none);
    # the far side may crop outputs whose windows start past the input.
    pads = ((0, 0, 0), (mh - 1, rows - oh, 0), (mw - 1, cols - ow, 0), (0, 0, 0))
    g_pad = lax.pad(g.astype(acc), jnp.zeros((), acc), pads)
    won_pad = lax.pad(winner, jnp.zeros((), winner.dtype), pads)

    def shifted(a: jax.Array, m_h: int, m_w: int) -> jax.Array:
        return a[:, mh - 1 - m_h : mh - 1 - m_h + rows, mw - 1 - m_w : mw - 1 - m_w + cols]

    def residue_class(r_h: int, r_w: int) -> jax.Array:
        total = jnp.zeros((n, rows, cols, g.shape[3]), acc)
        for m_h in range(mh):
            for m_w in range(mw):
                tap_h, tap_w = r_h + sh * m_h, r_w + sw * m_w
                if tap_h < kh and tap_w < kw:
                    mine = shifted(won_pad, m_h, m_w) == tap_h * kw + tap_w
                    total += jnp.where(mine, shifted(g_pad, m_h, m_w), 0)
        return total

    classes = jnp.stack(
        [jnp.stack([residue_class(r_h, r_w) for r_w in range(sw)], 3) for r_h in range(sh)], 2
    )  # (n, rows, sh, cols, sw, channels): padded input (s a + r_h, s b + r_w)
    dxp = classes.reshape(n, rows * sh, cols * sw, g.shape[3])
    return (dxp[:, lo_h : lo_h + h, lo_w : lo_w + w].astype(g.dtype),)


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
