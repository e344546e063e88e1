"""`models.conv.Conv` is `nn.Conv(use_bias=False)` with its kernel stored (out, h, w, in)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jia_jax.models.conv import Conv, from_flax_kernel, to_flax_kernel

# (kernel, strides, padding) as the models call them, and a non-square window and stride.
CASES = [
    ((1, 1), 1, "SAME"),
    ((1, 1), 2, "VALID"),
    ((3, 3), 2, ((1, 1), (1, 1))),
    ((5, 5), 1, ((2, 2), (2, 2))),
    ((3, 2), (2, 1), ((1, 0), (0, 1))),
]


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


@pytest.mark.parametrize("kernel_size, strides, padding", CASES)
def test_conv_is_nn_conv_float64(x64, kernel_size, strides, padding):
    """Outputs and the gradients of input and kernel agree with nn.Conv given the same kernel
    transposed. Both sum the same products in float64 (u ~ 1e-16) over at most 5*5*3 terms, so
    they agree to ~1e-14 relative; a wrong axis order gives O(1) or a shape error."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((2, 9, 11, 3)))
    ours = Conv(4, kernel_size, strides, padding=padding, dtype=jnp.float64)
    flax_conv = nn.Conv(4, kernel_size, strides, padding=padding, use_bias=False)
    kernel = jnp.asarray(rng.standard_normal((4, *kernel_size, 3)))
    assert ours.init(jax.random.key(0), x)["params"]["kernel"].shape == kernel.shape

    def outputs(module, k):
        def loss(x, k):
            y = module.apply({"params": {"kernel": k}}, x)
            return jnp.sum(y * jnp.cos(y)), y

        (_, y), (dx, dk) = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(x, k)
        return y, dx, dk

    y, dx, dk = outputs(ours, kernel)
    want_y, want_dx, want_dk = outputs(flax_conv, to_flax_kernel(kernel))
    for got, want in [(y, want_y), (dx, want_dx), (to_flax_kernel(dk), want_dk)]:
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12 * np.abs(want).max())


def test_init_is_nn_convs_kernel_transposed_and_dtypes_follow_nn_conv():
    """The same initializer and key draw the same numbers as nn.Conv's; the kernel is fp32 (the
    master) and the output in the compute dtype."""
    x = jnp.ones((1, 8, 8, 5), jnp.float32)
    init = nn.initializers.variance_scaling(2.0, "fan_out", "normal")
    ours = Conv(6, (3, 3), dtype=jnp.bfloat16, kernel_init=init)
    theirs = nn.Conv(6, (3, 3), use_bias=False, dtype=jnp.bfloat16, kernel_init=init)
    kernel = ours.init(jax.random.key(3), x)["params"]["kernel"]
    want = theirs.init(jax.random.key(3), x)["params"]["kernel"]
    assert kernel.shape == (6, 3, 3, 5) and kernel.dtype == jnp.float32
    np.testing.assert_array_equal(kernel, from_flax_kernel(want))
    assert ours.apply({"params": {"kernel": kernel}}, x).dtype == jnp.bfloat16
