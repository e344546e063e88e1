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


# 1x1 windows as `pointwise_as_dot` takes them (no padding; strides odd and even sizes meet), and
# one whose padding leaves it a convolution.
POINTWISE = [
    ((1, 1), 1, "SAME"),
    ((1, 1), 2, "SAME"),
    ((1, 1), 2, "VALID"),
    ((1, 1), (2, 3), ((0, 0), (0, 0))),
    ((1, 1), 1, ((1, 0), (0, 1))),
]


@pytest.mark.parametrize(
    "kernel_size, strides, padding, pointwise_as_dot",
    [(*case, False) for case in CASES] + [(*case, True) for case in POINTWISE],
)
def test_conv_is_nn_conv_float64(x64, kernel_size, strides, padding, pointwise_as_dot):
    """Outputs and the gradients of input and kernel agree with nn.Conv given the same kernel
    transposed, with 1x1 windows also as matrix products. Both sum the same products in float64
    (u ~ 1e-16) over at most 5*5*3 terms, so they agree to ~1e-14 relative; a wrong axis order,
    stride offset or output size gives O(1) or a shape error (9 x 11 pixels: odd sizes, where a
    strided 1x1 window's ceil(size / stride) outputs differ from floor)."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((2, 9, 11, 3)))
    ours = Conv(4, kernel_size, strides, padding=padding, dtype=jnp.float64,
                pointwise_as_dot=pointwise_as_dot)
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
    assert y.shape == want_y.shape
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


def test_pointwise_as_dot_is_a_matrix_product_only_where_it_can_be():
    """The option replaces the convolution by a dot_general for an unpadded 1x1 window and
    leaves every other window (and a padded 1x1 one) to the convolution."""
    x = jnp.ones((1, 6, 6, 3), jnp.float32)

    def primitives(kernel_size, padding):
        conv = Conv(4, kernel_size, padding=padding, pointwise_as_dot=True)
        variables = jax.eval_shape(lambda: conv.init(jax.random.key(0), x))
        jaxpr = jax.make_jaxpr(conv.apply)(variables, x)
        return {e.primitive.name for e in jaxpr.jaxpr.eqns}

    assert "dot_general" in primitives((1, 1), "SAME")
    assert "conv_general_dilated" not in primitives((1, 1), "VALID")
    assert "conv_general_dilated" in primitives((1, 1), ((1, 1), (1, 1)))
    assert "conv_general_dilated" in primitives((3, 3), "SAME")
