"""The models' BatchNorm(+add, +ReLU) computes flax's, and the layer options (the space-to-depth
stem, the sliced max-pool) compute the plain layers' function (the max-pool alone:
tests/test_max_pool.py).

Float64 comparisons run under `jax.enable_x64`: there the only differences are float64 roundings
(unit roundoff u = 2^-53 ~ 1.1e-16), so a wrong formula shows as an O(1) error against tolerances
of 1e-10 (one layer) to 1e-8 (a whole net). bf16 comparisons use a float64 reference on the same
(bf16-exact) inputs, with bounds from the bf16 rounding of the output (unit roundoff 2^-8) and
fp32 rounding of the reductions.
"""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import default
from jia_jax.models import create_model, layers
from jia_jax.models.call_order import backward_leaf_order
from jia_jax.models.space_to_depth import SpaceToDepthConv, conv_as_space_to_depth

BF16_U = 2.0**-8  # unit roundoff of bf16 (8 significant bits)
FP32_U = 2.0**-24
EPS = 1e-5  # the models' bn_epsilon
MOMENTUM = 0.9
# (relu, residual) as the models call BatchNormAct: projection BN, BN+ReLU, BN+add+ReLU.
VARIANTS = [(False, False), (True, False), (True, True)]


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


def _bn_inputs(shape, dtype, param_dtype, seed=0):
    """x with a different offset per channel (|mean| up to 6 std), params, running stats, dy."""
    rng = np.random.default_rng(seed)
    c = shape[-1]
    x = rng.standard_normal(shape) * rng.uniform(0.5, 2.0, c) + rng.uniform(-3.0, 3.0, c)
    data = {
        "x": x,
        "residual": rng.standard_normal(shape),
        "dy": rng.standard_normal(shape),
        "scale": rng.uniform(0.5, 1.5, c) * rng.choice([-1.0, 1.0], c),
        "bias": rng.standard_normal(c),
        "mean": rng.standard_normal(c),  # running averages, for eval mode
        "var": rng.uniform(0.5, 2.0, c),
    }
    # Round each value to the dtype the layer gets it in, so the float64 reference sees the same.
    rounding = dict.fromkeys(("x", "residual", "dy"), dtype) | dict.fromkeys(
        ("scale", "bias"), param_dtype
    )
    stats_dtype = jnp.promote_types(param_dtype, jnp.float32)
    return {
        k: np.asarray(jnp.asarray(v, rounding.get(k, stats_dtype)), np.float64)
        for k, v in data.items()
    }


class _FlaxBatchNormAct(nn.BatchNorm):
    """The reference: flax's own BatchNorm (two-pass variance), then + residual, then the ReLU."""

    @nn.compact
    def __call__(self, x, residual=None, *, relu=False):
        y = super().__call__(x)
        y = y if residual is None else residual() + y
        return nn.relu(y) if relu else y


def _run_bn(impl, train, data, relu, residual, dtype, param_dtype):
    """Output, updated batch_stats and the gradients ({scale, bias}, x[, residual]) for dy, of
    the models' layer (`layers.BatchNormAct`, impl "ours") or of flax's own ("flax")."""
    kwargs = {"momentum": MOMENTUM, "epsilon": EPS, "dtype": dtype, "param_dtype": param_dtype}
    if impl == "flax":
        module = _FlaxBatchNormAct(not train, use_fast_variance=False, **kwargs)
    else:
        module = layers.BatchNormAct(not train, **kwargs)
    # Running averages in fp32 as the models' (float64 in the float64 tests).
    stats_dtype = jnp.promote_types(param_dtype, jnp.float32)
    stats = {k: jnp.asarray(data[k], stats_dtype) for k in ("mean", "var")}

    def f(params, x, *res):
        shortcut = (lambda: res[0]) if res else None  # the models pass the shortcut as a function
        return module.apply(
            {"params": params, "batch_stats": stats},
            x,
            shortcut,
            relu=relu,
            mutable=["batch_stats"],
        )

    params = {k: jnp.asarray(data[k], param_dtype) for k in ("scale", "bias")}
    primals = [params, jnp.asarray(data["x"], dtype)]
    if residual:
        primals.append(jnp.asarray(data["residual"], dtype))
    y, vjp, state = jax.vjp(jax.jit(f), *primals, has_aux=True)
    grads = vjp(jnp.asarray(data["dy"], dtype))
    return y, state["batch_stats"], grads


def _reference_bn(data, train, relu, residual):
    """numpy float64: output, pre-ReLU z, xhat, the BN output (before the add), the new running
    averages."""
    x = data["x"]
    axes = tuple(range(x.ndim - 1))
    mean, var = (x.mean(axes), x.var(axes)) if train else (data["mean"], data["var"])
    xhat = (x - mean) / np.sqrt(var + EPS)
    bn = xhat * data["scale"] + data["bias"]
    z = bn + (data["residual"] if residual else 0.0)
    y = np.maximum(z, 0.0) if relu else z
    new = {"mean": data["mean"], "var": data["var"]}
    if train:
        new = {
            k: MOMENTUM * data[k] + (1 - MOMENTUM) * s for k, s in (("mean", mean), ("var", var))
        }
    return y, z, xhat, bn, new


def _assert_trees_close(got, want, atol):
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(w), rtol=0, atol=atol)


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("relu, residual", VARIANTS)
def test_bn_float64_matches_flax_and_numpy(x64, train, relu, residual):
    """Forward, running averages and all gradients, against numpy and the plain flax layers.

    A float64 sum of n terms errs by at most n * u * sum|terms|, u = 1.1e-16. Here n = 100 per
    channel, |x| <~ 9 (|mean| <= 6 std): the largest sums (flax's sum of x^2, the scale gradient's
    sum of g * xhat) have sum|terms| <~ 100 * 81, so every compared quantity is within
    100 * 1.1e-16 * 8100 ~ 1e-10 of exact in the worst case. A wrong formula errs by O(1).
    """
    data = _bn_inputs((4, 5, 5, 3), jnp.float64, jnp.float64)
    args = (train, data, relu, residual, jnp.float64, jnp.float64)
    y_flax, stats_flax, grads_flax = _run_bn("flax", *args)
    y_ref, *_, stats_ref = _reference_bn(data, train, relu, residual)
    _assert_trees_close(y_flax, y_ref, atol=1e-10)
    _assert_trees_close(stats_flax, stats_ref, atol=1e-10)
    # The models' layer (shifted one-pass statistics, autodiff) against flax's own BatchNorm
    # (two-pass): the same function, the same running averages, the same gradients.
    y, stats, grads = _run_bn("ours", *args)
    assert y.dtype == jnp.float64
    _assert_trees_close(y, y_ref, atol=1e-10)
    assert stats.keys() == stats_flax.keys() == {"mean", "var"}
    _assert_trees_close(stats, stats_flax, atol=1e-10)
    assert jax.tree.structure(grads) == jax.tree.structure(grads_flax)
    _assert_trees_close(grads, grads_flax, atol=1e-10)
    if relu:  # the ReLU clips some outputs, not all: the mask is exercised
        assert 0 < np.mean(y_ref == 0) < 1


@pytest.mark.parametrize("param_dtype", [jnp.float32, jnp.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("relu, residual", VARIANTS)
def test_bn_bf16_within_bf16_rounding_of_float64(train, relu, residual, param_dtype):
    """bf16 activations: output and gradients within bf16 rounding of float64.

    Parameters in fp32 (the master copy) or bf16 (the compute copy the trainer differentiates).

    The BN output is rounded to bf16 once, from an fp32 expression: |bn - bn64| <= 2^-8 |bn64|
    + slack * max|y64|, slack the fp32 error before that rounding, chiefly of the 288-value
    statistics, whose cancellation factor the shift of `batch_norm_ops.moments` keeps to
    kappa = 1 + (K - mean)^2 / var <~ 10 (K a sample, within ~3 std of the mean): worst case
    288 * 2^-24 * 10 ~ 2e-4, with randomly signed roundings sqrt(288) * 2^-24 * 10 ~ 1e-5, so
    slack = 1e-4. The ReLU commutes with rounding and is 1-Lipschitz; the residual add rounds
    once more, by 2^-8 |z|, so the bound on y is 2^-8 (|z64| + |bn64|) there (2^-8 |y64|
    without it). Statistics reduced in bf16 exceed it by ~1e-3 * max|y64|: ten times slack.

    The input gradient is computed in fp32, but autodiff returns it through the two casts of x
    to fp32 (the normalisation's and the statistics'), each rounding its own term to bf16 before
    the bf16 sum: the direct t_d = g * scale / std and, in training, t_s = dx - t_d through the
    batch statistics, which largely cancel. Hence |dx - dx64| <= 2^-8 |dx64| + 2^-8 (1 + 2^-8)
    (|t_d| + |t_s|) + slack * max|dx64| in training, and one rounding, 2^-8 |dx64|
    + slack * max|dx64|, in evaluation. The scale and bias gradients are fp32 sums, error
    <= n * 2^-24 * sum|terms|, then rounded to param_dtype: + 2^-8 |grad| for bf16.
    """
    slack = 1e-4
    data = _bn_inputs((8, 6, 6, 4), jnp.bfloat16, param_dtype, seed=1)
    y, stats, grads = _run_bn("ours", train, data, relu, residual, jnp.bfloat16, param_dtype)
    y_ref, z_ref, xhat, bn_ref, stats_ref = _reference_bn(data, train, relu, residual)

    assert y.dtype == jnp.bfloat16
    assert all(s.dtype == jnp.float32 for s in stats.values())
    assert [g.dtype for g in jax.tree.leaves(grads)] == (
        [param_dtype, param_dtype, jnp.bfloat16] + [jnp.bfloat16] * residual
    )
    err = np.abs(np.asarray(y, np.float64) - y_ref)
    rounded = np.abs(z_ref) + np.abs(bn_ref) if residual else np.abs(y_ref)
    assert np.all(err <= BF16_U * rounded + slack * np.abs(y_ref).max())
    _assert_trees_close(stats, stats_ref, atol=1e-5)  # fp32 rounding of O(1) values

    # Reference gradients: autodiff of flax's own BatchNorm in float64 on the same inputs.
    with jax.enable_x64(True):
        ref = _run_bn("flax", train, data, relu, residual, jnp.float64, jnp.float64)[2]
    (d_params, dx, *d_res), (ref_params, ref_dx, *_ref_res) = grads, ref
    ref_dx = np.asarray(ref_dx)
    g = np.where(z_ref > 0, data["dy"], 0.0) if relu else data["dy"]
    err = np.abs(np.asarray(dx, np.float64) - ref_dx)
    bound = BF16_U * np.abs(ref_dx) + slack * np.abs(ref_dx).max()
    if train:
        var = data["x"].var(tuple(range(g.ndim - 1)))
        direct = g * data["scale"] / np.sqrt(var + EPS)
        bound += BF16_U * (1 + BF16_U) * (np.abs(direct) + np.abs(ref_dx - direct))
    assert np.all(err <= bound)
    n = math.prod(g.shape[:-1])
    axes = tuple(range(g.ndim - 1))
    rounding = BF16_U if param_dtype == jnp.bfloat16 else 0.0
    for name, terms in (("bias", g), ("scale", g * xhat)):
        want = np.asarray(ref_params[name])
        bound = n * FP32_U * np.abs(terms).sum(axes) + rounding * np.abs(want)
        got = np.asarray(d_params[name], np.float64)
        assert np.all(np.abs(got - want) <= bound), name
    if residual:  # the masked bf16 dy itself, exactly
        np.testing.assert_array_equal(np.asarray(d_res[0], np.float64), g)


def test_bn_normalises_channels_far_from_zero_fp32():
    """fp32 channels N(100, 0.01^2) and N(3000, 1), normalised as the models' layers do.

    The float64 two-pass reference sees the same fp32 values. In fp32, x - mean is off by the
    rounding of the mean, ~ u |mean| times a sum's growth (log2 of the 8,192 terms: 13): the
    output errs by ~ 13 * 2^-24 * |mean| / std, 1e-2 for the first channel, 2e-3 for the second,
    at worst; randomly signed roundings give far less. E[x^2] - E[x]^2 loses relative accuracy
    ~ 2^-24 * mean^2 / var of the variance: 6 and 0.5 here, an O(1) error in the outputs.
    """
    rng = np.random.default_rng(8)
    shape = (32, 16, 16)
    x = np.stack([rng.normal(100.0, 0.01, shape), rng.normal(3000.0, 1.0, shape)], axis=-1)
    x = x.astype(np.float32)
    # An epsilon negligible beside both variances: the outputs have unit variance.
    module = layers.BatchNormAct(use_running_average=False, epsilon=1e-12, dtype=jnp.float32)
    variables = module.init(jax.random.key(0), x)
    y, _ = jax.jit(lambda v, x: module.apply(v, x, mutable=["batch_stats"]))(variables, x)
    x64 = x.astype(np.float64)
    axes = (0, 1, 2)
    want = (x64 - x64.mean(axes)) / np.sqrt(((x64 - x64.mean(axes)) ** 2).mean(axes))
    np.testing.assert_allclose(np.asarray(y, np.float64), want, rtol=0, atol=1e-2)


@pytest.mark.parametrize(
    "kernel, stride, pad, size",
    [(7, 2, 3, 16), (7, 2, 3, 15), (11, 4, 2, 35), (3, 2, 1, 9)],
    ids=["resnet_stem", "odd_size", "alexnet_conv1", "3x3s2"],
)
def test_space_to_depth_conv_is_the_strided_conv_float64(x64, kernel, stride, pad, size):
    """Output and both gradients equal lax's strided conv: each output is a sum of at most
    kernel^2 * 3 <= 363 O(1) products, the same products (plus exact zeros) in another order:
    error <= 363 * 1.1e-16 * 363 ~ 1.5e-11.
    """
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.standard_normal((2, size, size, 3)))
    w = jnp.asarray(rng.standard_normal((kernel, kernel, 3, 5)))
    padding = ((pad, pad), (pad, pad))

    def plain(x, w):
        return jax.lax.conv_general_dilated(
            x, w, (stride, stride), padding, dimension_numbers=("NHWC", "HWIO", "NHWC")
        )

    def rewritten(x, w):
        return conv_as_space_to_depth(x, w, stride, padding)

    want, vjp_want = jax.vjp(plain, x, w)
    got, vjp_got = jax.jit(lambda x, w: jax.vjp(rewritten, x, w))(x, w)
    assert got.shape == want.shape
    dy = jnp.asarray(rng.standard_normal(want.shape))
    _assert_trees_close((got, *vjp_got(dy)), (want, *vjp_want(dy)), atol=2e-11)


def test_space_to_depth_module_has_nn_conv_parameter_and_bf16_rounding():
    """Same `kernel` parameter as nn.Conv; both bf16 outputs within one bf16 rounding of float64
    (the products of bf16 values are exact in the fp32 accumulator; 147 of them: fp32 error
    <= 147 * 2^-24 * sum|terms|, far below 2^-8).
    """
    kwargs = {"features": 4, "kernel_size": (7, 7), "strides": 2, "padding": ((3, 3), (3, 3))}
    kwargs |= {"dtype": jnp.bfloat16, "kernel_init": nn.initializers.normal(1.0)}
    x = jnp.asarray(np.random.default_rng(3).standard_normal((2, 12, 12, 3)), jnp.bfloat16)
    conv = nn.Conv(use_bias=False, **kwargs)
    s2d = SpaceToDepthConv(**kwargs)
    variables = conv.init(jax.random.key(0), x)
    s2d_variables = s2d.init(jax.random.key(0), x)
    assert jax.tree.structure(s2d_variables) == jax.tree.structure(variables)
    np.testing.assert_array_equal(s2d_variables["params"]["kernel"], variables["params"]["kernel"])
    w64 = np.asarray(jnp.asarray(variables["params"]["kernel"], jnp.bfloat16), np.float64)
    with jax.enable_x64(True):
        ref = np.asarray(
            jax.lax.conv_general_dilated(
                jnp.asarray(np.asarray(x, np.float64)),
                jnp.asarray(w64),
                (2, 2),
                kwargs["padding"],
                dimension_numbers=("NHWC", "HWIO", "NHWC"),
            )
        )
    for module in (conv, s2d):
        y = module.apply(variables, x)
        assert y.dtype == jnp.bfloat16
        err = np.abs(np.asarray(y, np.float64) - ref)
        assert np.all(err <= BF16_U * np.abs(ref) + 1e-5 * np.abs(ref).max())


def _count(tree) -> int:
    return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(tree))


@pytest.mark.parametrize("name, count", [("resnet50", 25_557_032), ("alexnet_bn", 62_388_424)])
def test_options_keep_the_variables_of_the_plain_net(name, count):
    """Same variable tree, shapes and dtypes (so checkpoints load either way) at 224x224, and the
    same call order, hence the same all-reduce buckets (`call_order`)."""
    x = jnp.zeros((1, 224, 224, 3), jnp.float32)

    def variables(**options):
        model = create_model(name, num_classes=1000, dtype="bfloat16", **options)
        order = backward_leaf_order(model, x.shape[1:])
        return jax.eval_shape(lambda: model.init(jax.random.key(0), x, train=False)), order

    # The options as the default config sets them: every one on.
    options = {k: v for k, v in default.get_config().model.items() if k != "name"}
    assert options == {"space_to_depth_stem": True, "sliced_max_pool": True}
    (plain, plain_order), (optioned, optioned_order) = variables(), variables(**options)
    assert optioned_order == plain_order
    assert jax.tree.structure(optioned) == jax.tree.structure(plain)
    assert jax.tree.leaves(optioned) == jax.tree.leaves(plain)  # ShapeDtypeStructs
    assert _count(optioned["params"]) == count


def _random_kernels(shapes, seed):
    """Float64 variables of the `eval_shape`d `shapes`: LeCun-normal kernels (std 1/sqrt(fan in)
    of Conv's (out, h, w, in) and Dense's (in, out) layouts); the other leaves for `_randomise`."""
    rng = np.random.default_rng(seed)

    def leaf(path, v):
        name = path[-1].key
        if name != "kernel":
            assert name in ("scale", "bias", "mean", "var"), path  # all of them `_randomise`d
            return jnp.zeros(v.shape, jnp.float64)
        fan_in = math.prod(v.shape[1:]) if len(v.shape) == 4 else v.shape[0]
        return jnp.asarray(rng.standard_normal(v.shape) / math.sqrt(fan_in), jnp.float64)

    return jax.tree_util.tree_map_with_path(leaf, shapes)


def _randomise(variables, seed):
    """Non-trivial BN parameters and running statistics (zero-init gammas would hide the blocks)."""
    rng = np.random.default_rng(seed)

    def leaf(path, v):
        name = path[-1].key
        if name == "scale":
            return jnp.asarray(rng.uniform(0.5, 1.5, v.shape), v.dtype)
        if name in ("bias", "mean"):
            return jnp.asarray(0.3 * rng.standard_normal(v.shape), v.dtype)
        if name == "var":
            return jnp.asarray(rng.uniform(0.5, 2.0, v.shape), v.dtype)
        return v

    return jax.tree_util.tree_map_with_path(leaf, variables)


@pytest.mark.parametrize(
    "name, width, image", [("resnet50", 2, 32), ("alexnet_bn", 3, 64)], ids=["resnet50", "alexnet"]
)
def test_options_compute_the_plain_net_float64(x64, name, width, image):
    """Logits (train and eval), running averages and all parameter gradients agree.

    Float64 rounding (~1e-16) through ~50 layers, each BN renormalising to O(1) with a condition
    of at most ~1e2 on these tiny batches, stays far below 1e-8 relative; a wrong rewrite or
    backward gives O(1).
    """
    x = jnp.asarray(np.random.default_rng(5).standard_normal((4, image, image, 3)))

    def build(**options):
        return create_model(name, num_classes=3, dtype=jnp.float64, width=width, **options)

    plain, optioned = build(), build(space_to_depth_stem=True, sliced_max_pool=True)
    # Drawn here, not by a compiled `init` (ResNet-50's alone took ~8 s of the test's ~25 s).
    shapes = jax.eval_shape(lambda: plain.init(jax.random.key(0), x, train=False))
    variables = _randomise(_random_kernels(shapes, seed=7), seed=6)

    def run(model):
        def loss(params):
            v = {**variables, "params": params}
            logits, state = model.apply(v, x, train=True, mutable=["batch_stats"])
            return jnp.sum(logits * jnp.arange(1.0, 4.0)), (logits, state["batch_stats"])

        grads, (logits, stats) = jax.grad(loss, has_aux=True)(variables["params"])
        return logits, stats, grads, model.apply(variables, x, train=False)

    want = jax.jit(lambda: run(plain))()
    got = jax.jit(lambda: run(optioned))()
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-8 * max(1.0, np.abs(w).max()))
    assert jax.tree.structure(got) == jax.tree.structure(want)


def test_default_options_step_aside_where_they_do_not_apply():
    """On by default, so it must not break a model it cannot rewrite: with `small_inputs`
    (stride-1 stem) `space_to_depth_stem` leaves the net as it is."""
    options = {"num_classes": 2, "dtype": "float32", "width": 4, "small_inputs": True}
    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 8, 8, 3)), jnp.float32)
    plain = create_model("resnet18", **options)
    stem = create_model("resnet18", space_to_depth_stem=True, **options)
    # One compiled init: op by op, each model's took ~3 s more (one compile per new op).
    variables = jax.jit(lambda: plain.init(jax.random.key(0), x, train=False))()
    stem_shapes = jax.eval_shape(lambda: stem.init(jax.random.key(0), x, train=False))
    assert jax.tree.structure(stem_shapes) == jax.tree.structure(variables)
    np.testing.assert_array_equal(
        stem.apply(variables, x, train=False), plain.apply(variables, x, train=False)
    )
