"""The SPMD train step against a single-device reference, in one and in two processes."""

import functools
import json
import re
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs import digits
from jia_jax import loss as loss_lib
from jia_jax import mesh as mesh_lib
from jia_jax import models
from jia_jax import optimizers
from jia_jax import precision
from jia_jax import train
from tests import mp_util
from tests.test_main import run_main

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


def build_step(config, mesh):
    """`(model, tx, step)` of `config` on `mesh`: the tiny ResNet-18 and the trainer's step (not
    yet compiled)."""
    model = models.create_model(
        "resnet18",
        num_classes=10,
        dtype=jnp.float32,
        **{k: v for k, v in config.model.items() if k != "name"},
    )
    tx = optimizers.create_optimizer(config.optimizer, optax.constant_schedule(LR))
    return model, tx, train.make_train_step(model, tx, optax.constant_schedule(LR), config, mesh)


def build(config, mesh):
    """`(model, state, step)`: `build_step` and the initial state (compiled and run)."""
    model, tx, step = build_step(config, mesh)
    init, _ = train.state_initializer(model, tx, mesh, (IMAGE, IMAGE, 1), config.precision, seed=0)
    return model, init(), step


@functools.cache
def _slice_gradient(model):
    """jit of the fp32 gradient and new BN statistics of one slice (one compile per model)."""

    def loss_fn(params, batch_stats, x, y):
        logits, new = model.apply(
            {"params": params, "batch_stats": batch_stats}, x, train=True, mutable=["batch_stats"]
        )
        onehot = jax.nn.one_hot(y, 10)
        return -jnp.mean(jnp.sum(onehot * jax.nn.log_softmax(logits), -1)), new["batch_stats"]

    return jax.jit(jax.grad(loss_fn, has_aux=True))


def device_gradients(model, params, batch_stats, batch, num_devices, microbatches=1):
    """One device: fp32 gradients of every device's slice of the batch (of every microbatch of it,
    with microbatches) in float64, and the running BN statistics each slice would produce on a
    device of its own, from the same starting averages, in float64 (so a microbatch counts as a
    device would: one momentum step towards the mean). The loss is the plain cross-entropy (no
    label smoothing)."""
    grad_fn = _slice_gradient(model)
    grads, stats = [], []
    for x_dev, y_dev in zip(
        np.split(batch["image"], num_devices), np.split(batch["label"], num_devices)
    ):
        for x, y in zip(np.split(x_dev, microbatches), np.split(y_dev, microbatches)):
            g, slice_stats = grad_fn(params, batch_stats, x, y)
            grads.append(jax.tree.map(lambda a: np.asarray(a, np.float64), g))
            stats.append(jax.tree.map(lambda a: np.asarray(a, np.float64), slice_stats))
    return grads, stats


def tree_mean(trees):
    return jax.tree.map(lambda *xs: sum(xs) / len(xs), *trees)


def reference_step(model, params, batch_stats, batch, num_devices, microbatches=1):
    """`device_gradients` averaged in float64, then SGD with momentum and weight decay on weights
    only, written out by hand."""
    grads, stats = device_gradients(model, params, batch_stats, batch, num_devices, microbatches)
    grad = tree_mean(grads)
    # First momentum step: the trace equals the (decayed) gradient.
    new_params = jax.tree.map(
        lambda w, g: (
            np.asarray(w, np.float64) - LR * (g + (WD * np.asarray(w) if w.ndim > 1 else 0))
        ),
        params,
        grad,
    )
    return new_params, tree_mean(stats)


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


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_cross_entropy_with_label_smoothing_matches_numpy(dtype, smoothing):
    rng = np.random.default_rng(12)
    logits = jnp.asarray(3 * rng.normal(size=(16, 7)), dtype)
    labels = rng.integers(0, 7, size=16)
    got = loss_lib.cross_entropy(logits, jnp.asarray(labels), smoothing)
    # float64 from the same (dtype-rounded) logits: targets (1 - s) on the label plus s / C on
    # every class, against log_softmax.
    x = np.asarray(logits, np.float64)
    log_probs = x - x.max(1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(1, keepdims=True))
    targets = np.full(x.shape, smoothing / 7) + (1 - smoothing) * np.eye(7)[labels]
    assert got.dtype == jnp.float32  # computed in fp32 whatever the logits' dtype
    # fp32 log-softmax of logits |x| < 15: ~10 eps of the largest term.
    np.testing.assert_allclose(got, -(targets * log_probs).sum(1), rtol=1e-5, atol=1e-5)


def test_topk_correct_matches_argsort_and_counts_ties_for_the_label():
    rng = np.random.default_rng(13)
    logits = rng.normal(size=(64, 10)).astype(np.float32)  # distinct values: no ties
    labels = rng.integers(0, 10, size=64)
    order = np.argsort(-logits, axis=1)
    for k in (1, 5):
        want = np.any(order[:, :k] == labels[:, None], axis=1)
        assert 0 < want.sum() < len(want)  # both outcomes occur
        got = loss_lib.topk_correct(jnp.asarray(logits), jnp.asarray(labels), k)
        np.testing.assert_array_equal(got, want.astype(np.float32))
    # Ties count in the label's favour: all-equal logits put every label at rank 0.
    tied = loss_lib.topk_correct(jnp.zeros((3, 10)), jnp.asarray([0, 4, 9]), 1)
    np.testing.assert_array_equal(tied, [1.0, 1.0, 1.0])


def random_eval_variables(model, rng):
    """Initial variables with every BatchNorm made non-trivial (random running mean/var, scale and
    bias; the zero-initialised last scales of residual blocks included), so logits spread out."""
    variables = jax.jit(lambda key: model.init(key, jnp.zeros((1, IMAGE, IMAGE, 1)), train=False))(
        jax.random.key(0, impl="rbg")
    )
    params = jax.tree.map(
        lambda p: np.asarray(p) + (0.3 * rng.normal(size=p.shape) if p.ndim <= 1 else 0.0),
        variables["params"],
    )
    stats = jax.tree_util.tree_map_with_path(
        lambda path, s: (
            0.3 * rng.normal(size=s.shape)
            if path[-1].key == "mean"
            else np.exp(0.3 * rng.normal(size=s.shape))
        ),
        variables["batch_stats"],
    )
    return jax.tree.map(lambda x: np.asarray(x, np.float32), (params, stats))


def test_eval_step_matches_float64_sums_and_ignores_padding():
    """Loss / top-1 / top-5 sums on the 2x4 mesh against numpy float64 sums over the real rows of
    logits computed example by example on one device; padded rows (mask 0) count for nothing, on
    a device that is part padding and on two that are all padding."""
    config = tiny_config("hierarchical")
    config.loss.label_smoothing = 0.1  # training's smoothing must not leak into the eval loss
    mesh = mesh_lib.create_mesh(2, 4)
    model = models.create_model(
        "resnet18", num_classes=10, dtype=jnp.float32, width=4, small_inputs=True
    )
    rng = np.random.default_rng(11)
    params, stats = random_eval_variables(model, rng)
    batch = global_batch()
    real = np.arange(GLOBAL_BATCH) < 21  # devices 0-4 full, device 5 one real row, 6-7 padding
    real[[3, 9]] = False  # and two padded rows among real ones
    batch["mask"] = real.astype(np.float32)
    state = train.TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        batch_stats=stats,
        opt_state=(),
        loss_scale=precision.init_loss_scale(1.0, dynamic=False),
    )
    sharded = {k: jax.device_put(v, mesh_lib.batch_sharding(mesh)) for k, v in batch.items()}

    sums = jax.device_get(train.make_eval_step(model, config, mesh)(state, sharded))

    one = jax.jit(lambda x: model.apply({"params": params, "batch_stats": stats}, x, train=False))
    logits = np.stack(
        [np.asarray(one(batch["image"][i : i + 1])[0], np.float64) for i in np.flatnonzero(real)]
    )
    labels = batch["label"][real]
    label_logit = logits[np.arange(len(labels)), labels]
    shifted = logits - logits.max(axis=1, keepdims=True)
    loss = np.log(np.exp(shifted).sum(axis=1)) - (label_logit - logits.max(axis=1))
    order = np.argsort(-logits, axis=1)
    top = {k: np.any(order[:, :k] == labels[:, None], axis=1) for k in (1, 5)}
    # Ranks cannot flip under rounding: every other logit is > 1e-3 away from the label's, while
    # the two fp32 forward passes (batched on the mesh, one example here) differ by ~1e-6.
    others = np.abs(logits - label_logit[:, None])
    others[np.arange(len(labels)), labels] = np.inf
    assert others.min() > 1e-3
    assert 0 < top[1].sum() < top[5].sum() < len(labels)  # both counts discriminate

    assert float(sums["count"]) == real.sum()
    assert float(sums["top1"]) == top[1].sum()
    assert float(sums["top5"]) == top[5].sum()
    # fp32 logits (~20 layers, ~40 eps apart between the two programs) through an fp32 log-softmax
    # and a sum of 21 terms: relative 1e-5 of the total bounds it with margin.
    np.testing.assert_allclose(float(sums["loss"]), loss.sum(), rtol=1e-5)


# LARS in the step: a trust coefficient and learning rates that move kernels ~1% per step, so an
# error in the update shows in the parameters; the rate changes between the two steps.
LARS_ETA = 0.05
LARS_LR = optax.linear_schedule(0.2, 0.4, 1)  # 0.2 at count 0, 0.4 from count 1 on
F32_EPS = float(np.finfo(np.float32).eps)


def reference_lars(grad, params, momentum, lr):
    """You et al. 2017, Algorithm 1, in float64, with the repo's mask: kernels (ndim > 1) get weight
    decay and the trust ratio `eta ||w|| / (||g|| + wd ||w||)` (1 where a norm is 0); biases and
    BN parameters plain momentum. Returns (new params, new momentum)."""

    def direction(g, w):
        if w.ndim <= 1:
            return g
        w_norm, g_norm = np.linalg.norm(w), np.linalg.norm(g)
        ratio = LARS_ETA * w_norm / (g_norm + WD * w_norm) if w_norm and g_norm else 1.0
        return ratio * (g + WD * w)

    new_v = jax.tree.map(
        lambda g, w, v: MOMENTUM * v + lr * direction(g, w), grad, params, momentum
    )
    return jax.tree.map(lambda w, v: w - v, params, new_v), new_v


def assert_leaves_close(actual, expected, tolerances, floors=None):
    """Per leaf, 2-norm error `||a - e|| <= tol * ||e|| + floor` (floor 0 unless given)."""
    floors = floors or jax.tree.map(lambda _: 0.0, tolerances)
    for a, e, tol, floor in zip(
        *map(jax.tree.leaves, (actual, expected, tolerances, floors)), strict=True
    ):
        error = np.linalg.norm(np.asarray(a, np.float64) - e)
        assert error <= tol * np.linalg.norm(e) + floor, (error, np.linalg.norm(e), tol, floor)


def lars_tolerances(device_grads, steps_taken):
    """Relative tolerance per leaf of the LARS momentum buffer and update after `steps_taken` steps.

    Two fp32 backward passes through ~40 layers (forward and backward) round differently by up to
    ~40 eps of each device's gradient; averaging the devices scales that by the cancellation
    sum_i ||g_i|| / ||sum_i g_i|| (from the reference's per-device gradients; 1 for a leaf whose
    gradient is 0 everywhere). The trust ratio's norms add a few eps, each step inherits the
    previous step's error, and 10x is margin.
    """

    def cancellation(*g):
        total = np.linalg.norm(sum(g))
        return sum(map(np.linalg.norm, g)) / total if total else 1.0

    return jax.tree.map(
        lambda *g: 10 * 40 * F32_EPS * max(cancellation(*g), 1.0) * steps_taken, *device_grads
    )


def lars_setup(strategy: str):
    """`(config, mesh, model, tx, state)` of the LARS tests: the tiny config with LARS, the 2x4
    mesh, the tiny ResNet-18 and the trainer's seed-0 initial state with LARS's own (zero)
    momentum (the SGD tests' init program gives the same parameters and statistics, compiled once
    for all of them)."""
    config = tiny_config(strategy)
    config.optimizer.name = "lars"
    config.optimizer.trust_coefficient = LARS_ETA
    mesh = mesh_lib.create_mesh(2, 4)
    model = models.create_model(
        "resnet18", num_classes=10, dtype=jnp.float32, width=4, small_inputs=True
    )
    tx = optimizers.create_optimizer(config.optimizer, LARS_LR)
    _, state, _ = build(tiny_config(strategy), mesh)
    opt_state = jax.device_put(tx.init(state.params), mesh_lib.replicated_sharding(mesh))
    return config, mesh, model, tx, state.replace(opt_state=opt_state)


def assert_lars_step(model, mesh, batch, stats, t, before, after):
    """Step `t`'s momentum and params (`after`: trees) against float64 LARS on the mean of
    per-device fp32 gradients at the reference's own parameters (`before`: float64 trees of
    params and momentum); returns the reference's new `(params, momentum)`."""
    params, momentum = before
    # Train-mode BN uses the batch's statistics, so the running averages do not enter them.
    grads, _ = device_gradients(
        model, jax.tree.map(np.float32, params), stats, batch, mesh.devices.size
    )
    new_params, momentum = reference_lars(tree_mean(grads), params, momentum, float(LARS_LR(t)))
    tol = lars_tolerances(grads, steps_taken=t + 1)
    got_params, got_momentum = after
    assert_leaves_close(got_momentum, momentum, tol)
    # The parameters add one fp32 rounding of `w - v` (eps ||w||) per step to the update's
    # error; kernel updates are ~1% of ||w||, so this still resolves them to ~1e-5.
    floors = jax.tree.map(lambda w, n=t + 1: n * F32_EPS * np.linalg.norm(w), new_params)
    assert_leaves_close(
        jax.tree.map(lambda a, b: np.asarray(a, np.float64) - b, got_params, params),
        jax.tree.map(lambda a, b: a - b, new_params, params),
        tol,
        floors,
    )
    return new_params, momentum


def test_lars_step_on_the_mesh_matches_float64_algorithm1():
    """Two jitted SPMD steps with optimizer.name='lars' against numpy float64 LARS applied to the
    mean of per-device fp32 gradients (recomputed at the reference's own parameters each step)."""
    config, mesh, model, tx, state = lars_setup("hierarchical")
    step = train.make_train_step(model, tx, LARS_LR, config, mesh)
    params, stats = jax.device_get((state.params, state.batch_stats))
    batch = global_batch()
    sharded = {k: jax.device_put(v, mesh_lib.batch_sharding(mesh)) for k, v in batch.items()}
    params = jax.tree.map(lambda w: np.asarray(w, np.float64), params)
    reference = params, jax.tree.map(np.zeros_like, params)
    for t in range(2):
        state, metrics = step(state, sharded)
        reference = assert_lars_step(
            model, mesh, batch, stats, t, reference, (state.params, state.opt_state.momentum)
        )
        assert int(state.opt_state.count) == t + 1
        assert float(metrics["learning_rate"]) == pytest.approx(float(LARS_LR(t)))


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
    with open(tmp_path / "params.json") as f:
        got = json.load(f)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        # Same program, same reduction order per process pair; gloo sums may round differently.
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("field,value,says", [
    ("bucket_bytes", -5, "or -1"), ("hybrid_crossover_bytes", -2, "or -1"),
    ("first_bucket_bytes", -1, ">= 0."), ("last_bucket_bytes", -3, ">= 0."),
])
def test_a_bad_comm_size_names_its_field_whatever_the_strategy(field, value, says):
    # Caught when the step is built, before it compiles, even for 'xla', which reads no bucket
    # size (a typo there would otherwise surface only once the strategy changes); the message
    # says -1 is allowed where the communication model may choose the size.
    for strategy in ("xla", "flat"):
        config = tiny_config(strategy)
        config.comm[field] = value
        with pytest.raises(ValueError, match=rf"comm\.{field}={value}.*{re.escape(says)}"):
            build_step(config, mesh_lib.create_mesh(2, 4))


def test_a_float16_step_refuses_a_loss_scale_that_cannot_move():
    # Checked where float16 needs the scale, not for float32, which never reads it.
    config = tiny_config("flat")
    config.precision.loss_scale.factor = 1.0
    build_step(config, mesh_lib.create_mesh(2, 4))
    config.precision.compute = "float16"
    with pytest.raises(ValueError, match=r"precision\.loss_scale\.factor=1\.0"):
        build_step(config, mesh_lib.create_mesh(2, 4))


def test_the_communication_models_sizes_are_accepted():
    config = tiny_config("auto")
    config.comm.bucket_bytes = config.comm.hybrid_crossover_bytes = -1
    build_step(config, mesh_lib.create_mesh(2, 4))  # raises nothing: -1 is the model's choice


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
    # The same state at step 1: with a constant learning rate the step counter feeds only the
    # dropout key, so a different update means different masks (equal ones would be bitwise equal).
    # The counter is placed as the step places it, so this step reuses the compiled program.
    one = jax.device_put(jnp.ones((), jnp.int32), mesh_lib.replicated_sharding(mesh))
    later, _ = step(init().replace(step=one), batch)
    assert not all(np.array_equal(a, b) for a, b in zip(first_leaves, leaves(later)))


def logged_steps(stderr: str) -> list[dict[str, float]]:
    """The progress lines of a CLI run (`step k/n | name value | ...`), one dict per step, in order;
    `step` is k."""
    rows = []
    for k, fields in re.findall(r"step +(\d+)/\d+ \| (.*)", stderr):
        metrics = [
            f for f in fields.split(" | ")
            if not f.endswith(("img/s", "ms a step"))
            and not f.startswith(("input wait ", "ETA "))
        ]
        row = {name: float(v) for name, v in (f.rsplit(" ", 1) for f in metrics)}
        rows.append({"step": int(k), **row})
    return rows


def test_alexnet_bn_64k_config_end_to_end_on_cpu(tmp_path):
    """configs/alexnet_bn_64k.py through the CLI (LARS, poly-2 decay, microbatches, xla strategy,
    bf16) with only sizes shrunk, on a fixed synthetic batch."""
    # The model's width and stem are not config fields of alexnet_bn_64k (and locked configs take
    # no new fields from the command line), so a two-line config wraps it.
    (tmp_path / "alexnet_small.py").write_text(
        "from configs import alexnet_bn_64k\n\n\n"
        "def get_config():\n"
        "    config = alexnet_bn_64k.get_config()\n"
        "    config.model.width, config.model.small_inputs = 6, True\n"
        "    return config\n"
    )
    steps, batch = 6, 32
    # The config's 0.08 per 256 images (peak 20.5 at 64K) is 0.01 at batch 32: too small for
    # LARS (trust coefficient 0.001) to move the loss in 6 steps. 8 per 256 gives a peak of 1.
    base_lr = 8.0
    result = run_main(
        f"--config={tmp_path / 'alexnet_small.py'}",
        f"--workdir={tmp_path / 'work'}",
        "--config.data.name=synthetic",
        "--config.data.num_classes=10",
        "--config.data.image_size=16",
        f"--config.global_batch_size={batch}",
        "--config.microbatch_size=2",  # 4 images per device: 2 microbatches
        f"--config.total_steps={steps}",
        "--config.optimizer.warmup_epochs=0",
        f"--config.optimizer.base_learning_rate={base_lr}",
        "--config.mesh.node=2",
        "--config.mesh.gpu=4",
        "--config.log_every_steps=1",
        "--config.checkpoint_every_steps=3",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = logged_steps(result.stderr)
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    # The config's schedule: no warmup here, then poly-2 decay to 0 over the run. The log prints 4
    # significant digits.
    peak = base_lr * batch / 256
    for t, row in enumerate(rows):
        assert row["learning_rate"] == pytest.approx(peak * (1 - t / steps) ** 2, rel=1e-3)
    losses = [r["loss"] for r in rows]
    assert all(np.isfinite(losses))
    # Descent on a fixed batch: a decrease of ten times the log's resolution (0.001).
    assert losses[-1] < losses[0] - 0.01, losses
    assert sorted(p.name for p in (tmp_path / "work" / "checkpoints").iterdir()) == ["3", "6"]
