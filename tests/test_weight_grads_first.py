"""`model.weight_grads_first`: the same gradients, and backward's order constrained as promised."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from jia_jax.models import create_model
from jia_jax.models import weight_grads_first as tied


@pytest.mark.parametrize("stride, padding", [(1, "SAME"), (2, ((3, 3), (3, 3)))])
def test_tied_conv_is_the_convolution_and_its_vjp_bit_for_bit(stride, padding):
    """Forward and both gradients are computed by the same XLA ops as `jax.vjp` of the plain
    convolution, so they agree exactly; a wrong backward (e.g. swapped or unsummed gradients)
    differs by O(1)."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((2, 9, 9, 3)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((3, 3, 3, 5)), jnp.float32)
    kwargs = {"dimension_numbers": ("NHWC", "HWIO", "NHWC")}

    def plain(x, w):
        return lax.conv_general_dilated(x, w, (stride, stride), padding, **kwargs)

    def ours(x, w):
        return tied.conv_general_dilated(x, w, (stride, stride), padding, **kwargs)

    want, want_vjp = jax.vjp(plain, x, w)
    got, got_vjp = jax.vjp(ours, x, w)
    g = jnp.asarray(rng.standard_normal(want.shape), jnp.float32)
    np.testing.assert_array_equal(got, want)
    for a, b in zip(got_vjp(g), want_vjp(g), strict=True):
        np.testing.assert_array_equal(a, b)


def _grads(model, variables, x):
    def loss(params):
        logits, _ = model.apply(
            {**variables, "params": params}, x, train=True, mutable=["batch_stats"]
        )
        return jnp.sum(logits * jnp.arange(1.0, 4.0))

    return jax.grad(loss), variables["params"]


@pytest.mark.parametrize("name", ["resnet18", "alexnet_bn"])
def test_option_keeps_every_gradient_and_ties_each_convolution(name):
    """All parameter gradients equal without the option; with it, backward has one barrier per
    convolution tying its input gradient to its weight gradient (none without)."""
    options = {"num_classes": 3, "dtype": jnp.float32, "width": 4, "small_inputs": True}
    x = jnp.asarray(np.random.default_rng(1).standard_normal((2, 16, 16, 3)), jnp.float32)
    plain = create_model(name, **options)
    ours = create_model(name, weight_grads_first=True, **options)
    variables = plain.init(jax.random.key(0), x, train=False)
    convs = sum(1 for p in jax.tree_util.tree_leaves_with_path(variables["params"])
                if p[0][-1].key == "kernel" and p[1].ndim == 4)
    grads = {}
    for label, model in (("plain", plain), ("ours", ours)):
        grad, params = _grads(model, variables, x)
        grads[label] = jax.jit(grad)(params)
        jaxpr = jax.make_jaxpr(grad)(params)
        barriers = [e for e in _equations(jaxpr.jaxpr) if e.primitive.name == "optimization_barrier"]
        assert len(barriers) == (convs if label == "ours" else 0)
        # Each barrier holds an input gradient (4-D activations) and a weight gradient (HWIO).
        assert all(len(e.invars) == 2 for e in barriers)
    for a, b in zip(jax.tree.leaves(grads["ours"]), jax.tree.leaves(grads["plain"]), strict=True):
        np.testing.assert_array_equal(a, b)


def _equations(jaxpr):
    """Every equation of `jaxpr` and of the jaxprs nested in it (custom_vjp, pjit, scan)."""
    for eqn in jaxpr.eqns:
        yield eqn
        for value in eqn.params.values():
            inner = getattr(value, "jaxpr", value)
            if hasattr(inner, "eqns"):
                yield from _equations(inner)
