"""A convolution whose backward hands its input gradient on only once its weight gradient exists.

Across hosts the gradient buckets can be all-reduced while backward still runs only if each
bucket's last weight gradient is computed when backward passes its layer. In one XLA program
that order is the scheduler's, and XLA's GPU scheduler (memory-minimising) puts many
weight-gradient convolutions late, after much of the rest of backward: in the trainer's
ResNet-50 step the first 16 MiB bucket could start its all-reduce only after 101 of the 158
convolutions of forward and backward (docs/benchmarks.md, "Across hosts"; openxla/xla issue 1539
describes the same dgrad/wgrad ordering).

`conv_general_dilated` computes `lax.conv_general_dilated` and, in backward, passes the input
gradient and the weight gradient through one `optimization_barrier`: whatever reads the input
gradient (the layers below) waits for the weight gradient, so the weight gradients come out in
layer order as backward runs. The values are those of `jax.vjp` of the same convolution, bit for
bit; only the order of the schedule is constrained.
"""

from __future__ import annotations

from typing import Any

import jax
from jax import lax


def conv_general_dilated(lhs: jax.Array, rhs: jax.Array, *args: Any, **kwargs: Any) -> jax.Array:
    """`lax.conv_general_dilated(lhs, rhs, *args, **kwargs)` with the backward described above
    (a drop-in for `nn.Conv`'s ``conv_general_dilated`` field)."""

    def conv(x: jax.Array, w: jax.Array) -> jax.Array:
        return lax.conv_general_dilated(x, w, *args, **kwargs)

    @jax.custom_vjp
    def tied(x: jax.Array, w: jax.Array) -> jax.Array:
        return conv(x, w)

    def forward(x: jax.Array, w: jax.Array) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        return conv(x, w), (x, w)

    def backward(saved, g: jax.Array) -> tuple[jax.Array, jax.Array]:
        _, vjp = jax.vjp(conv, *saved)
        return tuple(lax.optimization_barrier(vjp(g)))

    tied.defvjp(forward, backward)
    return tied(lhs, rhs)
