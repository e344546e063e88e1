"""`scripts.bench.cudnn_genstats`: its shape list is ResNet-50's, its XLA variants compute what
they name (float64 numpy reference), and its per-step sums weight each shape by its count."""

import collections

import jax
import jax.numpy as jnp
import numpy as np

from jia_jax.models import create_model
from scripts.bench import cudnn_genstats
from tests import conv_checks


def _model_convs() -> collections.Counter:
    """(input size, in, out, kernel, stride) of every convolution in ResNet-50's forward pass."""
    model = create_model("resnet50", num_classes=1000, dtype="bfloat16")
    x = jax.ShapeDtypeStruct((1, 224, 224, 3), jnp.float32)
    variables = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros(x.shape), False))
    jaxpr = jax.make_jaxpr(lambda v, x: model.apply(v, x, train=False))(variables, x)
    found = collections.Counter()

    def visit(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "conv_general_dilated":
                lhs, rhs = eqn.invars[0].aval.shape, eqn.invars[1].aval.shape
                kernel = rhs[1]  # kernels stored (out, h, w, in)
                found[lhs[1], lhs[3], rhs[0], kernel, eqn.params["window_strides"][0]] += 1
            for value in eqn.params.values():
                if hasattr(value, "jaxpr"):
                    visit(value.jaxpr)

    visit(jaxpr.jaxpr)
    return found


def test_shapes_are_resnet50s_convolutions_after_the_stem():
    found = _model_convs()
    listed = collections.Counter({s[:5]: s[5] for s in cudnn_genstats.RESNET50_CONVS})
    stem = found - listed
    assert sum(stem.values()) == 1 and next(iter(stem))[:2] == (224, 3)
    assert found - stem == listed
    assert sum(listed.values()) == 52


def test_xla_variants_are_the_models_convolution_and_its_channel_sums():
    kx, kw = jax.random.split(jax.random.key(1))
    x = jax.random.normal(kx, (2, 7, 7, 8), jnp.bfloat16)
    w = (0.3 * jax.random.normal(kw, (6, 3, 3, 8))).astype(jnp.bfloat16)
    y, total, squares = jax.jit(cudnn_genstats.xla_conv_stats, static_argnums=2)(x, w, 2)
    want, terms = conv_checks.conv64(np.asarray(x, np.float64), np.asarray(w, np.float64), 2)
    assert y.shape == want.shape == (2, 4, 4, 6)
    conv_checks.assert_bf16_conv(y, want, terms, taps=72)
    conv_checks.assert_channel_sums(y, total, squares)


def test_a_shape_gives_a_row_per_variant_and_cudnn_failures_are_recorded():
    rows = cudnn_genstats.measure_shape(2, (8, 4, 8, 3, 2, 3), ["xla_conv", "cudnn_conv"])
    assert [r["variant"] for r in rows] == ["xla_conv", "cudnn_conv"]
    assert rows[0]["us"] > 0 and "error" not in rows[0]
    assert "us" not in rows[1] and rows[1]["error"]  # no cuDNN frontend (or GPU) here


def test_per_step_weights_each_shape_by_its_count_over_shapes_all_variants_timed():
    def row(batch, size, variant, us, count):
        r = {"batch": batch, "size": size, "in_channels": 4, "out_channels": 4, "kernel": 1,
             "stride": 1, "count": count, "variant": variant}
        return {**r, "us": us} if us is not None else {**r, "error": "refused"}

    rows = [row(256, 56, "a", 10.0, 3), row(256, 28, "a", 5.0, 2),
            row(256, 56, "b", 7.0, 3), row(256, 28, "b", None, 2),
            row(64, 56, "a", 2.0, 3)]
    got = {(r["batch"], r["variant"]): r for r in cudnn_genstats.per_step(rows)}
    # At 256 both shapes were tried by both variants; b failed one, so b has no total.
    assert set(got) == {(256, "a"), (64, "a")}
    assert got[256, "a"]["us"] == 3 * 10.0 + 2 * 5.0 and got[256, "a"]["shapes"] == 2
    assert got[64, "a"]["us"] == 6.0
