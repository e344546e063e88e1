"""The SPMD train step against a single-device reference, in one and in two processes."""

import json
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs import digits
from jia_jax import mesh as mesh_lib
from jia_jax import models
from jia_jax import optimizers
from jia_jax import train
from tests import mp_util

LR, WD, MOMENTUM = 0.05, 1e-3, 0.9
GLOBAL_BATCH, IMAGE = 32, 16


def tiny_config(strategy: str):
    config = digits.get_config()
    config.model.width = 4
    config.data.image_size = IMAGE
    config.global_batch_size = GLOBAL_BATCH
    config.optimizer.weight_decay = WD
    config.optimizer.momentum = MOMENTUM
    config.comm.strategy = strategy
    config.comm.bucket_bytes = 4096  # several buckets even for this tiny net
    return config


def global_batch() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {
        "image": rng.normal(size=(GLOBAL_BATCH, IMAGE, IMAGE, 1)).astype(np.float32),
        "label": rng.integers(0, 10, size=GLOBAL_BATCH).astype(np.int32),
    }


def build(config, mesh):
    model = models.create_model(
        "resnet18",
        num_classes=10,
        dtype=jnp.float32,
        **{k: v for k, v in config.model.items() if k != "name"},
    )
    tx = optimizers.create_optimizer(config.optimizer, optax.constant_schedule(LR))
    init, _ = train.state_initializer(model, tx, mesh, (IMAGE, IMAGE, 1), config.precision, seed=0)
    state = init()
    step = train.make_train_step(model, tx, optax.constant_schedule(LR), config, mesh)
    return model, state, step


def reference_step(model, params, batch_stats, batch, num_devices, microbatches=1):
    """One device: per-device grads and BN stats, averaged in float64, then SGD with momentum and
    weight decay on weights only, written out by hand. With microbatches, each device's slice is
    split again; gradients average over all pieces and each device's running BN statistics advance
    once per microbatch, in order."""
    grads, stats = [], []
    for x_dev, y_dev in zip(
        np.split(batch["image"], num_devices), np.split(batch["label"], num_devices)
    ):
        dev_stats = batch_stats
        for x, y in zip(np.split(x_dev, microbatches), np.split(y_dev, microbatches)):

            def loss_fn(p):
                logits, new = model.apply(
                    {"params": p, "batch_stats": dev_stats}, x, train=True, mutable=["batch_stats"]
                )
                onehot = jax.nn.one_hot(y, 10)
                return -jnp.mean(jnp.sum(onehot * jax.nn.log_softmax(logits), -1)), new[
                    "batch_stats"
                ]

            g, dev_stats = jax.grad(loss_fn, has_aux=True)(params)
            grads.append(jax.tree.map(lambda a: np.asarray(a, np.float64), g))
        stats.append(jax.tree.map(lambda a: np.asarray(a, np.float64), dev_stats))
    mean = lambda *xs: sum(xs) / len(xs)
    grad = jax.tree.map(mean, *grads)
    new_stats = jax.tree.map(mean, *stats)
    # First momentum step: the trace equals the (decayed) gradient.
    new_params = jax.tree.map(
        lambda w, g: (
            np.asarray(w, np.float64) - LR * (g + (WD * np.asarray(w) if w.ndim > 1 else 0))
        ),
        params,
        grad,
    )
    return new_params, new_stats


def assert_tree_close(actual, expected, rtol, atol):
    flat_a, tree_a = jax.tree.flatten(actual)
    flat_e, tree_e = jax.tree.flatten(expected)
    assert tree_a == tree_e
    for a, e in zip(flat_a, flat_e):
        np.testing.assert_allclose(np.asarray(a, np.float64), e, rtol=rtol, atol=atol)


@pytest.mark.parametrize("strategy, microbatches", [("xla", 1), ("hierarchical", 1), ("flat", 2)])
def test_mesh_step_equals_single_device_reference(strategy, microbatches):
    config = tiny_config(strategy)
    config.microbatch_size = GLOBAL_BATCH // 8 // microbatches
    mesh = mesh_lib.create_mesh(2, 4)
    model, state, step = build(config, mesh)
    params0 = jax.device_get(state.params)
    stats0 = jax.device_get(state.batch_stats)
    batch = global_batch()
    sharded = {k: jax.device_put(v, mesh_lib.batch_sharding(mesh)) for k, v in batch.items()}

    new_state, metrics = step(state, sharded)

    want_params, want_stats = reference_step(
        model, params0, stats0, batch, mesh.devices.size, microbatches
    )
    # fp32 compute vs float64 averaging: relative 1e-5, with an absolute floor for near-zero weights.
    assert_tree_close(new_state.params, want_params, rtol=1e-5, atol=1e-7)
    assert_tree_close(new_state.batch_stats, want_stats, rtol=1e-5, atol=1e-7)
    assert int(new_state.step) == 1
    assert np.isfinite(float(metrics["loss"]))


def test_two_processes_match_one_process(tmp_path):
    """2 processes x 4 CPU devices (jax.distributed over gloo) give the 2x4 single-process result."""
    config = tiny_config("hierarchical")
    mesh = mesh_lib.create_mesh(2, 4)
    _, state, step = build(config, mesh)
    batch = global_batch()
    sharded = {k: jax.device_put(v, mesh_lib.batch_sharding(mesh)) for k, v in batch.items()}
    want = jax.tree.leaves(jax.device_get(step(state, sharded)[0].params))

    script = textwrap.dedent(f"""
      import json, jax, numpy as np
      from jia_jax import mesh as mesh_lib
      from tests import test_train as t
      mesh = mesh_lib.create_mesh(-1, -1)
      assert dict(mesh.shape) == {{"node": 2, "gpu": 4}}, mesh.shape
      _, state, step = t.build(t.tiny_config("hierarchical"), mesh)
      local = GLOBAL = t.global_batch()
      half = t.GLOBAL_BATCH // 2
      p = jax.process_index()
      local = {{k: v[p * half:(p + 1) * half] for k, v in GLOBAL.items()}}
      batch = {{k: jax.make_array_from_process_local_data(mesh_lib.batch_sharding(mesh), v)
               for k, v in local.items()}}
      new, _ = step(state, batch)
      leaves = [np.asarray(x.addressable_data(0)).tolist() for x in jax.tree.leaves(new.params)]
      if p == 0:
        json.dump(leaves, open({str(tmp_path / "params.json")!r}, "w"))
      print("done", p)
  """)
    mp_util.run_multiprocess(script, num_processes=2, local_devices=4)
    got = json.load(open(tmp_path / "params.json"))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        # Same program, same reduction order per process pair; gloo sums may round differently.
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6, atol=1e-7)


def test_mesh_batch_mismatch_names_the_field():
    with pytest.raises(ValueError, match="mesh.node"):
        mesh_lib.create_mesh(3, 4)


def test_dropout_masks_follow_the_step_so_resume_is_exact():
    """AlexNet-BN with dropout trains on the mesh; a step's masks depend only on (seed, step)."""
    config = tiny_config("flat")
    mesh = mesh_lib.create_mesh(2, 4)
    model = models.create_model(
        "alexnet_bn",
        num_classes=10,
        dtype=jnp.float32,
        width=8,
        dropout_rate=0.5,
        small_inputs=True,
    )
    tx = optimizers.create_optimizer(config.optimizer, optax.constant_schedule(LR))
    init, _ = train.state_initializer(model, tx, mesh, (IMAGE, IMAGE, 1), config.precision, seed=0)
    step = train.make_train_step(model, tx, optax.constant_schedule(LR), config, mesh)
    batch = {k: jax.device_put(v, mesh_lib.batch_sharding(mesh)) for k, v in global_batch().items()}

    def leaves(state):
        return [np.asarray(x) for x in jax.tree.leaves(state.params)]

    first, _ = step(init(), batch)
    first_leaves = leaves(first)  # read before the next step donates `first`
    again, _ = step(init(), batch)
    for a, b in zip(first_leaves, leaves(again)):
        np.testing.assert_array_equal(a, b)  # same (seed, step): same masks, same update
    second, _ = step(first, batch)
    assert any(not np.array_equal(a, b) for a, b in zip(first_leaves, leaves(second)))
