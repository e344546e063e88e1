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
from tests import test_precision
from tests import test_train
from tests.test_main import run_main

INITIAL_SCALE = 2.0**10
BAD_DEVICE = 5


def rounding_bound(dtype) -> float:
    """Relative error bound of a low-precision step against fp32 gradients.

    Each of the ~36 layers on the forward and backward path of ResNet-18 rounds its inputs and
    weights to `dtype` (accumulating in fp32): n = 72 roundings of unit roundoff u. Rounding errors
    add like a random walk (Higham & Mary's probabilistic bound lambda * sqrt(n) * u); lambda = 3
    gives 25u: 1.2e-2 for fp16 (u = 2^-11), 9.8e-2 for bf16 (u = 2^-8).
    """
    return 3 * np.sqrt(72) * float(jnp.finfo(dtype).eps) / 2


# A leaf's gradient may cancel to much less than its terms, so no rounding bound holds leaf by leaf;
# 0.4 still fails a leaf whose gradient is missing (error 1), doubled (1), halved (0.5) or negated (2).
RTOL_LEAF = 0.4


def assert_stats_close(stats, want_stats, dtype):
    """Running BN statistics after one step: 0.1 * batch statistics (+ 0.9 for the variance).

    The batch statistics of O(1) activations carry the step's relative error; their 0.1 share
    gives the absolute floor for means near zero (twice that for variances, squares).
    """
    bound = rounding_bound(dtype)
    test_train.assert_tree_close(stats, want_stats, rtol=bound, atol=2 * 0.1 * bound)


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
    by leaf within `rtol_leaf` (relative 2-norm errors): every layer's gradient came through.

    Each comparison also allows one fp32 rounding of the stored parameters (eps * ||new||): an
    update below that resolution cannot be seen in them.
    """
    eps = float(np.finfo(np.float32).eps)
    got, want, floor = [], [], []
    for n, w, p in zip(
        jax.tree.leaves(new_params),
        jax.tree.leaves(want_params),
        jax.tree.leaves(params0),
        strict=True,
    ):
        got.append(np.ravel(np.asarray(n, np.float64) - p))
        want.append(np.ravel(w - p))
        floor.append(eps * np.linalg.norm(w))
        error = np.linalg.norm(got[-1] - want[-1])
        assert error <= rtol_leaf * np.linalg.norm(want[-1]) + floor[-1]
    got, want = np.concatenate(got), np.concatenate(want)
    assert np.linalg.norm(got - want) <= rtol_all * np.linalg.norm(want) + np.linalg.norm(floor)


def assert_replicas_bitwise_equal(tree, host_tree):
    """Every device's copy of every leaf has exactly the bytes (and dtype) of `host_tree`'s."""
    for leaf, host in zip(jax.tree.leaves(tree), jax.tree.leaves(host_tree), strict=True):
        assert len(leaf.addressable_shards) == 8
        for replica in leaf.addressable_shards:
            data = np.asarray(replica.data)
            assert data.dtype == host.dtype and data.tobytes() == host.tobytes(), replica.device


@pytest.fixture(scope="module")
def mesh():
    return mesh_lib.create_mesh(2, 4)


@pytest.fixture(scope="module")
def fp16(mesh):
    """The fp16 initial state and step (built once: each ResNet init costs a compile)."""
    return build(mixed_config("float16"), mesh)


@pytest.fixture(scope="module")
def reference(fp16, mesh):
    """Initial params/stats (shared by every dtype: same seed, fp32 init), the float64 reference
    of one SGD step from them, and the fp32 model it used."""
    params, stats = jax.device_get((fp16[0].params, fp16[0].batch_stats))
    config = mixed_config("float32")
    model = models.create_model(
        "resnet18",
        num_classes=10,
        dtype="float32",
        **{k: v for k, v in config.model.items() if k != "name"},
    )
    new_params, new_stats = test_train.reference_step(
        model, params, stats, test_train.global_batch(), mesh.devices.size
    )
    return params, stats, new_params, new_stats, model


def test_fp16_overflow_on_one_device_skips_the_step_everywhere(mesh, fp16, reference):
    state, step = fp16
    before = jax.device_get((state.params, state.batch_stats, state.opt_state))
    params0, stats0, want_params, want_stats, fp32_model = reference

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
    params2 = jax.device_get(state.params)
    bound = rounding_bound(jnp.float16)
    assert_update_close(params2, want_params, params0, rtol_all=bound, rtol_leaf=RTOL_LEAF)
    assert_stats_close(state.batch_stats, want_stats, jnp.float16)

    # 3. growth_interval=2 finite steps in a row: the scale doubles and the count restarts.
    state, metrics = step(state, shard(good, mesh))
    assert float(metrics["skipped"]) == 0.0
    assert int(state.step) == 3
    assert float(state.loss_scale.scale) == INITIAL_SCALE
    assert int(state.loss_scale.good_steps) == 0
    # ...and the step applied: the second momentum-SGD step from params2, with the reference's
    # first trace v1 = (params0 - want_params) / LR and fp32 gradients at params2, in float64.
    grads, _ = test_train.device_gradients(
        fp32_model, params2, stats0, test_train.global_batch(), mesh.devices.size
    )
    want3 = jax.tree.map(
        lambda p2, p0, w1, g: (
            p2
            - test_train.LR
            * (
                test_train.MOMENTUM * (p0 - w1) / test_train.LR
                + g
                + (test_train.WD * p2 if p2.ndim > 1 else 0.0)
            )
        ),
        jax.tree.map(lambda x: np.asarray(x, np.float64), params2),
        params0,
        want_params,
        test_train.tree_mean(grads),
    )
    assert_update_close(
        jax.device_get(state.params), want3, params2, rtol_all=bound, rtol_leaf=RTOL_LEAF
    )


def test_bf16_step_trains_fp32_master_state(mesh, reference):
    config = mixed_config("bfloat16")
    state, step = build(config, mesh)
    params0, _, want_params, want_stats, _ = reference
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
    assert_update_close(
        jax.device_get(state.params),
        want_params,
        params0,
        rtol_all=rounding_bound(jnp.bfloat16),
        rtol_leaf=RTOL_LEAF,
    )
    assert_stats_close(state.batch_stats, want_stats, jnp.bfloat16)


def test_fp16_cli_with_microbatches_skips_overflows_and_trains(tmp_path):
    """fp16 through the CLI with 2 microbatches per device, on a fixed synthetic batch. The initial
    loss scale 2^17 overflows fp16 in backward, so the run both skips steps and grows the scale.

    On a 1x2 mesh of 2 devices: neither the microbatch accumulation nor the loss-scale rule
    depends on the mesh (a skip agreed on by a 2x4 mesh: test_fp16_overflow_on_one_device_...),
    and a step's 8 images cost a quarter of the 2x4 mesh's 32."""
    steps, initial = 6, 2.0**17
    result = run_main(
        "--config=configs/digits.py",
        f"--workdir={tmp_path}",
        "--config.data.name=synthetic",
        "--config.data.num_classes=10",
        "--config.model.width=4",
        "--config.mesh.node=1",
        "--config.mesh.gpu=2",
        "--config.global_batch_size=8",
        "--config.microbatch_size=2",  # 4 images per device: 2 microbatches
        f"--config.total_steps={steps}",
        "--config.optimizer.warmup_epochs=0",
        "--config.optimizer.base_learning_rate=12.8",  # peak 0.4 at batch 8: visible progress
        "--config.precision.compute=float16",
        f"--config.precision.loss_scale.initial={initial}",
        "--config.precision.loss_scale.growth_interval=2",
        "--config.log_every_steps=1",
        "--config.checkpoint_every_steps=3",
        devices=2,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = test_train.logged_steps(result.stderr)
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    finite = [r["skipped"] == 0.0 for r in rows]
    assert not all(finite) and sum(finite) >= 2  # both branches of the loss-scale rule are taken
    # The logged scales follow the numpy rule replayed on the logged pattern (4 significant digits).
    want = test_precision.ref_scale_sequence(finite, initial, 2, 2.0, 1.0)
    assert [r["loss_scale"] for r in rows] == pytest.approx([s for s, _ in want], rel=1e-3)
    losses = [r["loss"] for r in rows]
    assert all(np.isfinite(losses))
    for k in range(steps - 1):
        if not finite[k]:
            # A skipped step changes nothing: the next step sees the same parameters and batch.
            assert losses[k + 1] == losses[k], (k, losses)
    # The applied steps descend on the fixed batch: by ten times the log's resolution (0.001).
    assert losses[-1] < losses[0] - 0.01, losses
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["3", "6"]
