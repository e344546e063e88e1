"""Tests for jia_jax.models: parameter counts, mixed-precision dtypes, BatchNorm, zero-init."""

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import default
from jia_jax.models import MODEL_NAMES, create_model
from jia_jax.models.alexnet import adaptive_avg_pool
from jia_jax.models.layers import BatchNormAct
from jia_jax.models.resnet import BasicBlock, BottleneckBlock, ResNet


def _abstract_variables(model: nn.Module, image_size: int) -> dict:
    """Variable shapes without computing anything (jax.eval_shape)."""
    x = jnp.zeros((1, image_size, image_size, 3), jnp.float32)
    return jax.eval_shape(lambda: model.init(jax.random.key(0), x, train=False))


def _init(model: nn.Module, x: jax.Array) -> dict:
    # The 'rbg' PRNG compiles several times faster on CPU than the default threefry.
    return jax.jit(lambda: model.init(jax.random.key(0, impl="rbg"), x, train=False))()


def _count(tree) -> int:
    return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(tree))


@pytest.mark.parametrize(
    "name, expected",
    [
        # torchvision's counts for the same nets (convs without bias, BN gamma/beta, fc w+b).
        ("resnet18", 11_689_512),
        ("resnet34", 21_797_672),
        ("resnet50", 25_557_032),
        ("resnet101", 44_549_160),
    ],
)
def test_resnet_parameter_count(name, expected):
    variables = _abstract_variables(create_model(name, num_classes=1000, dtype="bfloat16"), 224)
    assert _count(variables["params"]) == expected


def test_alexnet_bn_parameter_count_and_pool5_size():
    # Hand count at 1000 classes. Convs and fc6/fc7 have no bias (BN follows); every BN has
    # gamma and beta, one pair per channel/feature.
    conv = (
        11 * 11 * 3 * 96  # conv1      34,848
        + 5 * 5 * 96 * 256  # conv2   614,400
        + 3 * 3 * 256 * 384  # conv3  884,736
        + 3 * 3 * 384 * 384  # conv4 1,327,104
        + 3 * 3 * 384 * 256  # conv5  884,736
    )  # 3,745,824
    bn = 2 * (96 + 256 + 384 + 384 + 256 + 256 + 4096 + 4096)  # conv1..5, pool5, fc6, fc7: 19,648
    fc = (
        6 * 6 * 256 * 4096  # fc6 37,748,736
        + 4096 * 4096  # fc7 16,777,216
        + (4096 * 1000 + 1000)  # fc8 4,097,000 (with bias: no BN after the logits)
    )  # 58,622,952
    assert conv + bn + fc == 62_388_424

    model = create_model("alexnet_bn", num_classes=1000, dtype="bfloat16")
    variables = _abstract_variables(model, 224)
    assert _count(variables["params"]) == conv + bn + fc

    # At 224x224 pool5 must already be 6x6 (so the adaptive pool is the identity there).
    x = jnp.zeros((1, 224, 224, 3), jnp.float32)
    _, state = jax.eval_shape(
        lambda v: model.apply(
            v, x, train=False, capture_intermediates=lambda m, _: m.name == "pool5_bn"
        ),
        variables,
    )
    assert state["intermediates"]["pool5_bn"]["__call__"][0].shape == (1, 6, 6, 256)


def test_adaptive_avg_pool_matches_torch_bins():
    rng = np.random.default_rng(0)
    # Bins [floor(i*H/6), ceil((i+1)*H/6)) written out by hand for H = 4 and H = 1.
    bins = {4: [(0, 1), (0, 2), (1, 2), (2, 3), (2, 4), (3, 4)], 1: [(0, 1)] * 6}
    for size, size_bins in bins.items():
        x = rng.standard_normal((2, size, size, 3))
        expected = np.empty((2, 6, 6, 3))
        for i, (r0, r1) in enumerate(size_bins):
            for j, (c0, c1) in enumerate(size_bins):
                expected[:, i, j] = x[:, r0:r1, c0:c1].mean(axis=(1, 2))
        got = adaptive_avg_pool(jnp.asarray(x, jnp.float32), 6)
        # fp32 sums of <= 4 unit-normal values: errors ~1e-7; 1e-6 leaves margin.
        np.testing.assert_allclose(np.asarray(got, np.float64), expected, atol=1e-6)
    x6 = jnp.asarray(rng.standard_normal((1, 6, 6, 2)), jnp.bfloat16)
    assert adaptive_avg_pool(x6, 6) is x6


@pytest.fixture(scope="module")
def tiny_resnet50():
    """A bf16 ResNet-50 of width 4 on 8x8 images, initialised once for the tests below."""
    model = create_model("resnet50", num_classes=5, dtype=jnp.bfloat16, width=4, small_inputs=True)
    return model, _init(model, jnp.zeros((6, 8, 8, 3), jnp.float32))


def test_resnet_bf16_forward_and_batchnorm_update(tiny_resnet50):
    """bf16 compute, fp32 BN statistics and logits; the running mean/var follow numpy float64.

    Small-integer images and stem kernel make the stem conv's output small integers, exact in
    bf16, so stem_bn's input is known exactly whatever XLA fuses, and an fp32 reduction of it
    must match float64 to fp32 rounding, while a bf16 one would be off by ~2^-9 relative.
    """
    model, variables = tiny_resnet50
    rng = np.random.default_rng(1)
    x = rng.integers(-2, 3, size=(6, 8, 8, 3)).astype(np.float64)
    kernel = rng.integers(-1, 2, size=(3, 3, 3, 4)).astype(np.float64)
    stored = jnp.asarray(kernel.transpose(3, 0, 1, 2), jnp.float32)  # (out, h, w, in): conv.py
    params = {**variables["params"], "stem_conv": {"kernel": stored}}
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(params))

    logits, state = jax.jit(
        lambda v, x: model.apply(
            v,
            x,
            train=True,
            mutable=["batch_stats", "intermediates"],
            capture_intermediates=lambda m, _: m.name == "stem_conv",
        )
    )({**variables, "params": params}, jnp.asarray(x, jnp.float32))
    assert logits.shape == (6, 5) and logits.dtype == jnp.float32
    assert np.all(np.isfinite(np.asarray(logits)))
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(state["batch_stats"]))

    # 3x3 stride-1 conv with zero padding 1, in float64.
    xp = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    h = sum(
        np.einsum("nhwc,co->nhwo", xp[:, i : i + 8, j : j + 8], kernel[i, j])
        for i in range(3)
        for j in range(3)
    )
    stem_out = state["intermediates"]["stem_conv"]["__call__"][0]
    assert stem_out.dtype == jnp.bfloat16  # the convs really run in bf16
    np.testing.assert_array_equal(np.asarray(stem_out, np.float64), h)  # integers |h| <= 54

    # Batch mean and biased variance over N, H, W blended into the initial running averages
    # (0 and 1) with momentum 0.9. The statistics are shifted by a sample K of each channel
    # (|K| <= 54): x - K and its square are integers whose sums over n = 384 are exact in fp32
    # (< 2^24). The mean then errs by two roundings of values <= 54 (the division, K + E[x - K]);
    # the variance by ~4 roundings of values <= E[(x - K)^2] <= 108^2. Times the blend's 0.1:
    # 6.4e-7 and 2.8e-4. A bf16 reduction errs by ~2^-9 of the variances (~28 here): 5e-3, and
    # rounds partial sums of the mean past 256 to even integers: ~1e-4 after the blend.
    stats = state["batch_stats"]["stem_bn"]
    mean_atol, var_atol = 0.1 * 2 * 2**-24 * 54, 0.1 * 4 * 2**-24 * 108**2
    np.testing.assert_allclose(stats["mean"], 0.1 * h.mean(axis=(0, 1, 2)), atol=mean_atol)
    np.testing.assert_allclose(stats["var"], 0.9 + 0.1 * h.var(axis=(0, 1, 2)), atol=var_atol)


def test_resnet_last_bn_gamma_zero_init(tiny_resnet50):
    _, variables = tiny_resnet50
    params = variables["params"]
    blocks = [k for k in params if k.startswith("stage")]
    assert len(blocks) == 3 + 4 + 6 + 3
    for block in blocks:
        for layer, p in params[block].items():
            if "scale" in p:
                # bn3 ends the residual branch; bn1, bn2 and the projection's BN start at 1.
                expected = 0.0 if layer == "bn3" else 1.0
                np.testing.assert_array_equal(p["scale"], expected, err_msg=f"{block}/{layer}")


@pytest.mark.parametrize("block_cls, channels", [(BasicBlock, 4), (BottleneckBlock, 16)])
def test_fresh_residual_block_is_identity(block_cls, channels):
    """Zero last gamma (and zero beta) make the residual branch 0: the block is relu(x)."""
    block = block_cls(
        features=4,
        strides=1,
        conv=functools.partial(nn.Conv, use_bias=False),
        norm=functools.partial(BatchNormAct, use_running_average=False),
    )
    x = jnp.asarray(np.random.default_rng(4).standard_normal((2, 5, 5, channels)), jnp.float32)
    variables = jax.jit(block.init)(jax.random.key(0, impl="rbg"), x)
    y, _ = jax.jit(lambda v: block.apply(v, x, mutable=["batch_stats"]))(variables)
    np.testing.assert_array_equal(y, np.maximum(np.asarray(x), 0.0))


def test_alexnet_bf16_small_images_and_dropout():
    model = create_model(
        "alexnet_bn",
        num_classes=7,
        dtype="bfloat16",
        width=6,
        small_inputs=True,
        dropout_rate=0.5,
    )
    x = jnp.asarray(np.random.default_rng(2).standard_normal((4, 8, 8, 3)), jnp.float32)
    variables = _init(model, x)

    @jax.jit
    def train_apply(seed):
        rngs = {"dropout": jax.random.key(seed, impl="rbg")}
        return model.apply(variables, x, train=True, mutable=["batch_stats"], rngs=rngs)

    logits, state = train_apply(1)
    assert logits.shape == (4, 7) and logits.dtype == jnp.float32
    assert np.all(np.isfinite(np.asarray(logits)))
    stats = state["batch_stats"]
    assert set(stats) == {f"conv{i}_bn" for i in range(1, 6)} | {"pool5_bn", "fc6_bn", "fc7_bn"}
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(stats))
    assert all(np.any(s["mean"] != 0) for s in stats.values())  # every BN layer updated
    # Dropout is active in training (another mask, other logits) ...
    assert not np.array_equal(logits, train_apply(2)[0])
    # ... and off in evaluation, which then needs no 'dropout' RNG (apply would raise).
    eval_logits = jax.jit(lambda v: model.apply(v, x, train=False))(variables)
    assert eval_logits.shape == (4, 7) and np.all(np.isfinite(np.asarray(eval_logits)))


def test_unknown_model_name_lists_valid_names():
    with pytest.raises(ValueError, match=r"model\.name") as err:
        create_model("vgg16", num_classes=10, dtype="float32")
    assert all(name in str(err.value) for name in MODEL_NAMES)


def test_bad_depth_is_rejected():
    with pytest.raises(ValueError, match="depth 20"):
        ResNet(num_classes=10, depth=20)
    with pytest.raises(ValueError, match=r"model\.depth"):
        create_model("resnet50", num_classes=10, dtype="float32", depth=18)


def test_backward_leaf_order_follows_the_forward_calls_reversed():
    """Buckets must fill in the order backward produces gradients, not jax's sorted-key order."""
    import jax

    from jia_jax.models.call_order import backward_leaf_order

    model = create_model("resnet101", num_classes=10, dtype="float32", width=2, small_inputs=True)
    order = backward_leaf_order(model, (8, 8, 3))
    params = jax.eval_shape(
        lambda: model.init(jax.random.key(0), jnp.zeros((1, 8, 8, 3)), train=False)
    )["params"]
    paths = [tuple(k.key for k in p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
    assert sorted(order) == list(range(len(paths)))
    modules = [paths[i][0] for i in order]
    assert modules[0] == "classifier" and modules[-1] in ("stem_conv", "stem_bn")
    # Independent expectation: stage 3 has 23 blocks, backward visits block23 ... block1.
    stage3 = list(dict.fromkeys(m for m in modules if m.startswith("stage3_")))
    assert stage3 == [f"stage3_block{i}" for i in range(23, 0, -1)]
    # Within a bottleneck block backward meets bn3 / conv3 before conv1.
    block = [paths[i][1] for i in order if paths[i][0] == "stage2_block1"]
    assert block.index("conv3") < block.index("conv2") < block.index("conv1")


def test_default_resnet_grads_under_shard_map_with_replicated_params():
    """`jax.grad` of the mean loss inside a vma-checked `jax.shard_map` (params replicated, batch
    sharded): the pattern a custom-VJP BatchNorm broke (its backward returned a per-device
    cotangent for the replicated scale). The gradient must be the mean of the per-shard gradients.

    Both sides run the same fp32 ops on the same shards; they differ only in summation order
    (XLA's reductions, the cross-device mean), each ~ 2^-24 relative per sum, grown by the
    BatchNorms' ~1e1 conditioning over 20 layers: well below 1e-4 of the largest gradient, while
    a wrong or missing reduction gives O(1) relative errors.
    """
    options = {k: v for k, v in default.get_config().model.items() if k != "name"}
    model = create_model("resnet18", num_classes=3, dtype="float32", width=4, **options)
    devices = 2
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:devices]), ("batch",))
    rng = np.random.default_rng(9)
    x = jnp.asarray(rng.standard_normal((2 * devices, 64, 64, 3)), jnp.float32)
    labels = jnp.asarray(rng.integers(0, 3, 2 * devices))
    variables = _init(model, x)
    # Non-zero last gammas, so every block's residual branch carries gradient.
    params = jax.tree.map(lambda p: p + 0.1, variables["params"])

    def local_loss(params, x, labels):
        logits, _ = model.apply(
            {**variables, "params": params}, x, train=True, mutable=["batch_stats"]
        )
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], 1))

    def per_device(params, x, labels):
        return jax.grad(lambda p: jax.lax.pmean(local_loss(p, x, labels), "batch"))(params)

    P = jax.sharding.PartitionSpec
    sharded = jax.shard_map(
        per_device, mesh=mesh, in_specs=(P(), P("batch"), P("batch")), out_specs=P()
    )
    got = jax.jit(sharded)(params, x, labels)
    shards = [(x[2 * k : 2 * k + 2], labels[2 * k : 2 * k + 2]) for k in range(devices)]
    per_shard = [jax.jit(jax.grad(local_loss))(params, *shard) for shard in shards]
    want = jax.tree.map(lambda *g: sum(g) / devices, *per_shard)
    scale = max(float(jnp.abs(g).max()) for g in jax.tree.leaves(want))
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-4 * scale)
    # The shards' gradients differ (per-device BatchNorm batches): the mean is not trivially one.
    assert not np.allclose(jax.tree.leaves(per_shard[0])[0], jax.tree.leaves(per_shard[1])[0])
