"""fp16 and bf16 train steps on the 2x4 mesh: loss-scale skip and growth, fp32 master state."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jia_jax import mesh as mesh_lib
from jia_jax import models
from jia_jax import optimizers
from jia_jax import precision
from jia_jax import train
from tests import test_train

INITIAL_SCALE = 2.0**10
BAD_DEVICE = 5


def mixed_config(compute: str):
    """test_train's tiny ResNet-18 on 16x16 inputs (SGD, momentum, weight decay) in `compute`."""
    config = test_train.tiny_config("hierarchical")
    config.precision.compute = compute
    config.precision.loss_scale.initial = INITIAL_SCALE
    config.precision.loss_scale.growth_interval = 2
    config.precision.loss_scale.factor = 2.0
    return config


def build(config, mesh):
    model = models.create_model(
        "resnet18",
        num_classes=10,
        dtype=precision.compute_dtype(config.precision.compute),
        **{k: v for k, v in config.model.items() if k != "name"},
    )
    schedule = optax.constant_schedule(test_train.LR)
    tx = optimizers.create_optimizer(config.optimizer, schedule)
    image_shape = (test_train.IMAGE, test_train.IMAGE, 1)
    init, _ = train.state_initializer(model, tx, mesh, image_shape, config.precision, seed=0)
    return init(), train.make_train_step(model, tx, schedule, config, mesh)


def shard(batch, mesh):
    return {k: jax.device_put(v, mesh_lib.batch_sharding(mesh)) for k, v in batch.items()}


def assert_update_close(new_params, want_params, params0, rtol_all, rtol_leaf):
    """The update `new - params0` matches the reference's, as one vector within `rtol_all` and leaf
    by leaf within `rtol_leaf` (relative 2-norm errors): every layer's gradient came through."""
    got, want = [], []
    for n, w, p in zip(
        jax.tree.leaves(new_params),
        jax.tree.leaves(want_params),
        jax.tree.leaves(params0),
        strict=True,
    ):
        got.append(np.ravel(np.asarray(n, np.float64) - p))
        want.append(np.ravel(w - p))
        assert np.linalg.norm(got[-1] - want[-1]) <= rtol_leaf * np.linalg.norm(want[-1])
    got, want = np.concatenate(got), np.concatenate(want)
    assert np.linalg.norm(got - want) <= rtol_all * np.linalg.norm(want)


def assert_replicas_bitwise_equal(tree, host_tree):
    """Every device's copy of every leaf has exactly the bytes (and dtype) of `host_tree`'s."""
    for leaf, host in zip(jax.tree.leaves(tree), jax.tree.leaves(host_tree), strict=True):
        assert len(leaf.addressable_shards) == 8
        for replica in leaf.addressable_shards:
            data = np.asarray(replica.data)
            assert data.dtype == host.dtype and data.tobytes() == host.tobytes(), replica.device


def reference_sgd_step(model, params, batch_stats, batch, num_devices):
    """fp32 gradients and BN statistics of each device's chunk (one jitted vmap), averaged in
    float64, then the first step of momentum SGD (the trace equals the gradient) with weight decay on
    kernels only, written out by hand."""

    def chunk(x, y):
        def loss_fn(p):
            logits, new = model.apply(
                {"params": p, "batch_stats": batch_stats}, x, train=True, mutable=["batch_stats"]
            )
            log_probs = jax.nn.log_softmax(logits)
            return -jnp.mean(jnp.take_along_axis(log_probs, y[:, None], -1)), new["batch_stats"]

        return jax.grad(loss_fn, has_aux=True)(params)

    def split(a):
        return a.reshape(num_devices, -1, *a.shape[1:])

    def mean(a):
        return np.mean(np.asarray(a, np.float64), axis=0)

    grads, stats = jax.device_get(
        jax.jit(jax.vmap(chunk))(split(batch["image"]), split(batch["label"]))
    )
    new_params = jax.tree.map(
        lambda w, g: (
            np.asarray(w, np.float64)
            - test_train.LR
            * (mean(g) + (test_train.WD * np.asarray(w, np.float64) if w.ndim > 1 else 0.0))
        ),
        params,
        grads,
    )
    return new_params, jax.tree.map(mean, stats)


@pytest.fixture(scope="module")
def mesh():
    return mesh_lib.create_mesh(2, 4)


@pytest.fixture(scope="module")
def fp16(mesh):
    """The fp16 initial state and step (built once: each ResNet init costs a compile)."""
    return build(mixed_config("float16"), mesh)


@pytest.fixture(scope="module")
def reference(fp16, mesh):
    """Initial params/stats (shared by every dtype: same seed, fp32 init) and the float64 reference
    of one SGD step from them."""
    params, stats = jax.device_get((fp16[0].params, fp16[0].batch_stats))
    config = mixed_config("float32")
    model = models.create_model(
        "resnet18",
        num_classes=10,
        dtype="float32",
        **{k: v for k, v in config.model.items() if k != "name"},
    )
    new_params, new_stats = reference_sgd_step(
        model, params, stats, test_train.global_batch(), mesh.devices.size
    )
    return params, stats, new_params, new_stats


def test_fp16_overflow_on_one_device_skips_the_step_everywhere(mesh, fp16, reference):
    state, step = fp16
    before = jax.device_get((state.params, state.batch_stats, state.opt_state))
    params0, _, want_params, want_stats = reference

    good = test_train.global_batch()
    bad = {k: v.copy() for k, v in good.items()}
    device = jax.devices()[BAD_DEVICE]
    rows = mesh_lib.batch_sharding(mesh).devices_indices_map(bad["image"].shape)[device][0]
    bad["image"][rows.start, 3, 5, 0] = np.inf  # one pixel of one image, on device 5 only
    bad = shard(bad, mesh)
    nonfinite = {
        s.device
        for s in bad["image"].addressable_shards
        if not np.all(np.isfinite(np.asarray(s.data)))
    }
    assert nonfinite == {device}

    # 1. The inf poisons device 5's gradient, hence the mean: nothing changes but the counters.
    state, metrics = step(state, bad)
    assert float(metrics["skipped"]) == 1.0
    assert not np.isfinite(float(metrics["loss"]))
    assert_replicas_bitwise_equal((state.params, state.batch_stats, state.opt_state), before)
    assert int(state.step) == 1
    assert float(state.loss_scale.scale) == INITIAL_SCALE / 2
    assert float(metrics["loss_scale"]) == INITIAL_SCALE / 2
    assert int(state.loss_scale.good_steps) == 0

    # 2. A clean batch applies: from the untouched state this is the first SGD step, so it must
    # match the float64 reference of one fp32 step.
    state, metrics = step(state, shard(good, mesh))
    assert float(metrics["skipped"]) == 0.0
    assert int(state.step) == 2
    assert float(state.loss_scale.scale) == INITIAL_SCALE / 2
    assert int(state.loss_scale.good_steps) == 1
    # fp16 forward/backward (11-bit mantissa) against fp32 gradients: measured relative errors
    # 2e-3 for the whole update, at most 4e-2 for a single (tiny) BN leaf, 1.1e-4 absolute for
    # the BN statistics; the bounds leave 3-5x room.
    params2 = jax.device_get(state.params)
    assert_update_close(params2, want_params, params0, rtol_all=1e-2, rtol_leaf=0.15)
    test_train.assert_tree_close(state.batch_stats, want_stats, rtol=1e-2, atol=5e-4)

    # 3. growth_interval=2 finite steps in a row: the scale doubles and the count restarts.
    state, metrics = step(state, shard(good, mesh))
    assert float(metrics["skipped"]) == 0.0
    assert int(state.step) == 3
    assert float(state.loss_scale.scale) == INITIAL_SCALE
    assert int(state.loss_scale.good_steps) == 0
    params3 = jax.tree.leaves(jax.device_get(state.params))
    assert all(np.all(np.isfinite(x)) for x in params3)
    unchanged = [
        np.array_equal(a, b) for a, b in zip(params3, jax.tree.leaves(params2), strict=True)
    ]
    assert not all(unchanged)


def test_bf16_step_trains_fp32_master_state(mesh, reference):
    config = mixed_config("bfloat16")
    state, step = build(config, mesh)
    params0, _, want_params, want_stats = reference
    assert_replicas_bitwise_equal(state.params, params0)  # the same fp32 init as fp16's

    state, metrics = step(state, shard(test_train.global_batch(), mesh))

    assert "skipped" not in metrics  # bf16 has no loss scaling
    assert float(state.loss_scale.scale) == 1.0
    floats = [
        x
        for x in jax.tree.leaves((state.params, state.batch_stats, state.opt_state))
        if np.issubdtype(x.dtype, np.floating)
    ]
    assert floats and all(x.dtype == np.float32 for x in floats)
    # bf16 keeps an 8-bit mantissa (~0.4% per rounding): measured relative errors 1.4e-2 for the
    # whole update, at most 0.13 for a single (tiny) BN leaf, 2.4e-4 absolute for the BN
    # statistics; the bounds leave 3-4x room (a leaf with no gradient would be off by ~1).
    assert_update_close(
        jax.device_get(state.params), want_params, params0, rtol_all=5e-2, rtol_leaf=0.4
    )
    test_train.assert_tree_close(state.batch_stats, want_stats, rtol=5e-2, atol=1e-3)
