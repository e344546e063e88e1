"""The train step's semantics: microbatches count as devices, the schedule follows applied updates,
the 'xla' mean cannot overflow fp16, bf16 and fp8 wires train like an fp32 one, and the loss is the
config's label-smoothed cross-entropy."""

import re

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from jia_jax import allreduce
from jia_jax import mesh as mesh_lib
from jia_jax import train
from tests.test_train import GLOBAL_BATCH, build, build_step, global_batch, tiny_config

F32_U = 2.0**-24
BF16_U = 2.0**-8
FP8_U = 2.0**-4


def _run(config, mesh, batches, state=None):
    """Runs the trainer's step on each batch; returns the final state and every step's metrics.

    `state`, a host copy of an initial state (every test's is the same seed-0 init), starts the
    run instead of a fresh init, whose program would be traced again (or, on a mesh of its own,
    compiled again) only to give the same values."""
    if state is None:
        _, state, step = build(config, mesh)
    else:
        _, _, step = build_step(config, mesh)
        state = jax.device_put(state, mesh_lib.replicated_sharding(mesh))
    metrics = []
    for batch in batches:
        sharded = {k: jax.device_put(v, mesh_lib.batch_sharding(mesh)) for k, v in batch.items()}
        state, m = step(state, sharded)
        metrics.append(jax.device_get(m))  # synced: few steps in flight on CPU
    return jax.device_get(state), metrics


def _tree_max_abs_diff(a, b) -> float:
    return max(
        float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
    )


def test_microbatches_on_one_device_update_like_as_many_devices():
    # 32 images as 8 microbatches of 4 on one device, or 4 images on each of 8 devices: the same
    # 8 BatchNorm batches, so the same gradient mean and the same running statistics (one
    # momentum step towards the mean of the 8 batch statistics; before the fix the microbatch path
    # took 8 sequential steps, i.e. momentum 0.9^8 on the old averages).
    batch = global_batch()
    config = tiny_config("flat")
    many_mesh = mesh_lib.create_mesh(2, 4)
    _, state, _ = build(config, many_mesh)
    state0 = jax.device_get(state)  # the same initial state on the one device: no init there
    config.microbatch_size = 4
    one, _ = _run(config, mesh_lib.create_mesh(1, 1, devices=jax.devices()[:1]), [batch], state0)
    config.microbatch_size = 0
    many, _ = _run(config, many_mesh, [batch], state0)
    # Both sum 8 fp32 terms in a different order (scan vs psum): the means differ by at most
    # ~8 u_f32 of the terms' magnitudes (|terms| <= ~10 here), and one SGD step with lr 0.05
    # moves parameters by lr times that: far below 1e-5. The statistics are means of 8 fp32
    # values of magnitude <= ~10: within 8 u_f32 * 10 ~ 5e-6. A momentum bug moves them by
    # > 1e-2.
    assert _tree_max_abs_diff(one.batch_stats, many.batch_stats) < 1e-5
    assert _tree_max_abs_diff(one.params, many.params) < 1e-5


def test_logged_learning_rate_is_the_rate_of_the_applied_update():
    # fp16 skips a step with non-finite gradients and keeps the optimizer state, so the schedule
    # (which reads the optimizer's count) does not advance; the logged rate must say the same.
    config = tiny_config("flat")
    config.precision.compute = "float16"
    mesh = mesh_lib.create_mesh(1, 1, devices=jax.devices()[:1])
    schedule = optax.linear_schedule(0.1, 0.9, transition_steps=8)
    from jia_jax import optimizers  # the test's own optimizer with a schedule that moves

    tx = optimizers.create_optimizer(config.optimizer, schedule)
    model, state, _ = build(config, mesh)
    # This optimizer's state placed as the step places its output state, so the second step
    # reuses the first's program (a default placement compiled the whole step again).
    opt_state = jax.device_put(tx.init(state.params), mesh_lib.replicated_sharding(mesh))
    state = state.replace(opt_state=opt_state)
    step = train.make_train_step(model, tx, schedule, config, mesh)
    good = global_batch()
    bad = {**good, "image": np.full_like(good["image"], np.inf)}
    logged = []
    for batch in (good, bad, good):
        sharded = {k: jax.device_put(v, mesh_lib.batch_sharding(mesh)) for k, v in batch.items()}
        state, m = step(state, sharded)
        m = jax.device_get(m)
        logged.append((float(m["learning_rate"]), float(m["skipped"])))
    assert [s for _, s in logged] == [0.0, 1.0, 0.0]
    # Rates of counts 0, 1 (the skipped step would have applied count 1), then 1 again: the
    # skipped step advanced nothing. Exact fp32 values of the schedule.
    expected = [float(np.float32(schedule(c))) for c in (0, 1, 1)]
    assert [lr for lr, _ in logged] == expected
    assert int(state.step) == 3 and int(train.schedule_count(state)) == 2


def test_xla_strategy_mean_divides_before_an_fp16_sum():
    # comm.strategy='xla' averages per-device values stacked on a leading axis. 8 x 40,960 sums to
    # 327,680, past fp16's 65,504: summing first gave inf (a false overflow that skips the step).
    # Every value on the way is exact (see test_allreduce), so the mean must be exactly 40,960.
    stacked = {"w": jnp.full((8, 5), 40960.0, jnp.float16)}
    out = allreduce.stacked_mean(stacked, "float16")
    assert out["w"].dtype == jnp.float16
    np.testing.assert_array_equal(np.asarray(out["w"], np.float64), 40960.0)
    # fp32/bf16 wires sum first: the same exact mean.
    for wire in ("float32", "bfloat16"):
        np.testing.assert_array_equal(
            np.asarray(allreduce.stacked_mean(stacked, wire)["w"], np.float64), 40960.0
        )


@pytest.mark.parametrize("wire", ["bfloat16", "float16", "float32"])
def test_xla_strategy_reduces_over_the_devices_in_the_wire_dtype(wire):
    # XLA turns the reduction over the sharded device axis into the all-reduce: its operand dtype
    # is what crosses the wire. jnp.sum accumulated bf16/fp16 in fp32 (twice the bytes).
    mesh = mesh_lib.create_mesh(2, 4)
    stacked = jax.ShapeDtypeStruct((8, 1024), jnp.bfloat16, sharding=mesh_lib.batch_sharding(mesh))
    mean = jax.jit(lambda g: allreduce.stacked_mean(g, wire))
    hlo = mean.lower(stacked).as_text(dialect="hlo")
    reduces = re.findall(r"= (\w+)\[1024\]\{0\} reduce\(", hlo)
    assert reduces == [{"bfloat16": "bf16", "float16": "f16", "float32": "f32"}[wire]], hlo


def test_xla_strategy_train_step_carries_bf16_gradient_reductions():
    # The trainer's own step, not `stacked_mean` alone: with comm.dtype bf16 each parameter's
    # gradient is summed over the stacked device axis in bf16, the reduction that XLA's SPMD
    # partitioner turns into the all-reduce. The model computes in fp32, so a bf16 reduction
    # can only be the wire's.
    config = tiny_config("xla")
    config.comm.dtype = "bfloat16"
    mesh = mesh_lib.create_mesh(2, 4)
    model, tx, step = build_step(config, mesh)
    # Lowering needs only the state's shapes, dtypes and shardings: the abstract state, no init.
    _, state = train.state_initializer(model, tx, mesh, (16, 16, 1), config.precision, seed=0)
    batch = {k: jax.device_put(v, mesh_lib.batch_sharding(mesh)) for k, v in global_batch().items()}
    hlo = step.lower(state, batch).as_text(dialect="hlo")
    bf16_sums = re.findall(r"= bf16\[([\d,]*)\]\{[\d,]*\} reduce\(.*dimensions=\{0\}", hlo)
    shapes = [",".join(map(str, p.shape)) for p in jax.tree.leaves(state.params)]
    assert sorted(bf16_sums) == sorted(shapes), hlo


def _wire_gap(strategy: str, wire: str) -> tuple[float, float]:
    """The norm of the difference between the parameter changes of three SGD steps on a 2x4 mesh
    with gradients sent in `wire` and in fp32, and the norm of the fp32 run's changes."""
    rng = np.random.default_rng(3)
    batches = [
        {
            "image": rng.normal(size=(GLOBAL_BATCH, 16, 16, 1)).astype(np.float32),
            "label": rng.integers(0, 10, size=GLOBAL_BATCH).astype(np.int32),
        }
        for _ in range(3)
    ]
    mesh = mesh_lib.create_mesh(2, 4)
    config = tiny_config(strategy)
    _, state0, _ = build(config, mesh)
    host0 = jax.device_get(state0)
    changes = {}
    for dtype in ("float32", wire):
        config.comm.dtype = dtype
        state, _ = _run(config, mesh, batches, host0)
        changes[dtype] = [
            np.asarray(a, np.float64) - b
            for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(host0.params))
        ]
    num = np.sqrt(sum(np.sum((a - b) ** 2) for a, b in zip(changes[wire], changes["float32"])))
    den = np.sqrt(sum(np.sum(b**2) for b in changes["float32"]))
    return num, den


def test_a_bf16_wire_trains_within_its_rounding_of_an_fp32_wire():
    # A bf16 wire rounds each device's gradient once (u = 2^-8) and each of the 7 partial sums
    # once: the mean of 8 same-sign terms is off by at most 8 u = 3.1%, and with mixed signs the
    # error is bounded by 8 u times the mean of |terms|, which for these gradients is within a
    # few times the mean's magnitude. Over 3 steps at a constant rate the parameter change stays
    # linear in the gradients to first order, so we require the parameter changes to agree within
    # 3 x 8 u (9.4%) in norm, and that they differ at all (the wire dtype is really used).
    num, den = _wire_gap("hierarchical", "bfloat16")
    assert 0 < num <= 3 * 8 * BF16_U * den, (num, den)


def test_an_fp8_wire_trains_within_its_rounding_of_an_fp32_wire():
    # The fp8 wire (jia_jax/fp8_wire.py) rounds each device's chunk once and the mean's chunk once
    # (u = 2^-4 each, or 2^-10 of the chunk's scale among fp8's subnormals): as above, within
    # 3 x 2 u (37.5%) in norm over 3 steps; and not equal (the fp8 wire is really used).
    num, den = _wire_gap("flat", "float8_e4m3fn")
    assert 0 < num <= 3 * 2 * FP8_U * den, (num, den)


def test_auto_communication_plan_trains_like_an_explicit_one():
    # comm.strategy='auto' with the buckets and crossover left to the communication model: every
    # plan computes the same mean, so one step must match the explicit 'flat' step to the
    # rounding of a different summation order (see test_microbatches_... for the bound).
    batch = global_batch()
    mesh = mesh_lib.create_mesh(2, 4)
    config = tiny_config("flat")
    _, state, _ = build(config, mesh)
    state0 = jax.device_get(state)
    explicit, _ = _run(config, mesh, [batch], state0)
    config.comm.strategy = "auto"
    config.comm.bucket_bytes = config.comm.hybrid_crossover_bytes = -1
    model, _, _ = build_step(config, mesh)
    comm = train.resolve_comm(config.comm, model, mesh, state0.params, (16, 16, 1))
    assert comm.strategy in allreduce.STRATEGIES and comm.bucket_bytes > 0
    assert comm.hybrid_crossover_bytes >= 0
    chosen, _ = _run(config, mesh, [batch], state0)
    assert _tree_max_abs_diff(explicit.params, chosen.params) < 1e-5


def test_resolve_comm_plans_a_last_bucket_only_where_the_step_sends_one(monkeypatch):
    # 'auto' is planned for the buckets the step sends: the config's last bucket where they are
    # packed during backward (two nodes), none where after it (one node: `train.late_buckets`).
    from jia_jax import comm_model

    config = tiny_config("auto")
    config.comm.bucket_bytes = config.comm.hybrid_crossover_bytes = -1
    config.comm.last_bucket_bytes = 1 << 20
    seen = []
    resolve = comm_model.resolve

    def spy(comm, **kwargs):
        seen.append(comm.last_bucket_bytes)
        return resolve(comm, **kwargs)

    monkeypatch.setattr(comm_model, "resolve", spy)
    for nodes in (2, 1):
        mesh = mesh_lib.create_mesh(nodes, 8 // nodes)
        model, tx, _ = build_step(config, mesh)
        _, state = train.state_initializer(model, tx, mesh, (16, 16, 1), config.precision, seed=0)
        comm = train.resolve_comm(config.comm, model, mesh, state.params, (16, 16, 1))
        assert comm.last_bucket_bytes == 1 << 20  # the config itself is kept
    assert seen == [1 << 20, 0]


def test_resolve_comm_prices_the_leaves_in_the_order_the_step_packs_them(monkeypatch):
    # 'auto' is planned over the leaves in `plan_buckets`' packing order: with `vectors_last`,
    # the kernels first and the vectors (the tail of sizes) last; without, backward's order.
    from jia_jax import comm_model
    from jia_jax.models import call_order

    seen = []
    resolve = comm_model.resolve

    def spy(comm, **kwargs):
        seen.append(kwargs["leaf_sizes"])
        return resolve(comm, **kwargs)

    monkeypatch.setattr(comm_model, "resolve", spy)
    mesh = mesh_lib.create_mesh(2, 4)
    wanted = []
    for vectors_last in (True, False):
        config = tiny_config("auto")
        config.comm.vectors_last = vectors_last
        model, tx, _ = build_step(config, mesh)
        _, state = train.state_initializer(model, tx, mesh, (16, 16, 1), config.precision, seed=0)
        train.resolve_comm(config.comm, model, mesh, state.params, (16, 16, 1))
        plan = allreduce.plan_buckets(
            state.params, 1 << 62, "float32", call_order.backward_leaf_order(model, (16, 16, 1)),
            vectors_last=vectors_last,
        )
        wanted.append([s.size for s in plan.buckets[0]])
    assert seen == wanted and wanted[0] != wanted[1]
    assert sorted(wanted[0]) == sorted(wanted[1])


def test_resolve_comm_plans_for_the_network_the_config_names(monkeypatch):
    # resolve_comm hands `comm_model.resolve` the links of `comm.network` when the run spans
    # hosts (here pretended), NVLink only on one host; an unknown name fails clearly.
    from jia_jax import comm_model

    mesh = mesh_lib.create_mesh(2, 4)
    config = tiny_config("auto")
    config.comm.bucket_bytes = config.comm.hybrid_crossover_bytes = -1
    model, tx, _ = build_step(config, mesh)
    # The plan reads only the parameters' shapes: the abstract state has them, with no init run.
    _, state = train.state_initializer(model, tx, mesh, (16, 16, 1), config.precision, seed=0)
    seen = []
    resolve = comm_model.resolve

    def spy(*args, **kwargs):
        seen.append(kwargs["model"])
        return resolve(*args, **kwargs)

    monkeypatch.setattr(comm_model, "resolve", spy)
    for processes, network, want in [
        (2, "emulated", comm_model.load_emulated_hosts()),
        (2, "", comm_model.load_model()),
        (2, "ndr400_per_node", comm_model.load_model(fabric="ndr400_per_node")),
        (1, "emulated", comm_model.load_model(single_host=True)),
    ]:
        monkeypatch.setattr(jax, "process_count", lambda n=processes: n)
        config.comm.network = network
        comm = train.resolve_comm(config.comm, model, mesh, state.params, (16, 16, 1))
        assert seen[-1] == want, (processes, network)
        assert comm.network == network and comm.strategy in allreduce.STRATEGIES
    assert comm_model.load_emulated_hosts() != comm_model.load_model()  # the cases differ
    # Processes that the launcher says share this host (launch_local.sh without --hosts): NVLink.
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setenv("JIA_JAX_LOCAL_PROCESSES", "2")
    config.comm.network = "emulated"
    train.resolve_comm(config.comm, model, mesh, state.params, (16, 16, 1))
    assert seen[-1] == comm_model.load_model(single_host=True)
    config.comm.network = "carrier_pigeon"
    with pytest.raises(ValueError, match="comm.network='carrier_pigeon' is not one of"):
        train.resolve_comm(config.comm, model, mesh, state.params, (16, 16, 1))
    with pytest.raises(ValueError, match="carrier_pigeon"):  # explicit strategies: at build
        config.comm.strategy = "flat"
        train.make_train_step(model, None, None, config, mesh)


@pytest.mark.parametrize(
    "choice, nodes, held",
    [("auto", 1, True), ("auto", 2, False), ("always", 2, True), ("never", 1, False)],
)
def test_pack_after_backward_holds_the_gradients_where_the_config_says(
    monkeypatch, caplog, choice, nodes, held
):
    # "auto": packed after backward on a one-node mesh (one host's links), during it across nodes.
    config = tiny_config("flat")
    config.comm.pack_after_backward = choice
    mesh = mesh_lib.create_mesh(nodes, 8 // nodes)
    held_leaves = []
    hold = allreduce.hold_until_backward_ends
    monkeypatch.setattr(
        allreduce, "hold_until_backward_ends",
        lambda grads: held_leaves.append(len(jax.tree.leaves(grads))) or hold(grads),
    )
    model, tx, step = build_step(config, mesh)
    _, state = train.state_initializer(model, tx, mesh, (16, 16, 1), config.precision, seed=0)
    batch = {k: jax.device_put(v, mesh_lib.batch_sharding(mesh)) for k, v in global_batch().items()}
    with caplog.at_level("INFO"):
        step.lower(state, batch)
    assert held_leaves == ([len(jax.tree.leaves(state.params))] if held else [])
    # and the log says so
    sent = "after" if held else "during"
    line = (
        "flat all-reduce of 0.00390625 MiB buckets, the vectors in the last, in float32, "
        f"concatenated, sent {sent} back"
    )
    assert line in caplog.text


def test_the_log_names_the_last_buckets_own_limit_and_the_release(caplog):
    config = tiny_config("flat")
    config.comm.last_bucket_bytes = 1 << 20
    config.comm.release_before_last = True
    mesh = mesh_lib.create_mesh(2, 4)
    model, tx, step = build_step(config, mesh)
    _, state = train.state_initializer(model, tx, mesh, (16, 16, 1), config.precision, seed=0)
    batch = {k: jax.device_put(v, mesh_lib.batch_sharding(mesh)) for k, v in global_batch().items()}
    with caplog.at_level("INFO"):
        step.lower(state, batch)  # the reduction is built, and logged, for the batch's shape
    line = (
        "flat all-reduce of 0.00390625 MiB buckets (the last of 1 MiB) in float32, concatenated, "
        "sent during backward, the others updated under the last one's all-reduce"
    )
    assert line not in caplog.text  # the default packs the vectors last, and says so
    assert line.replace(" in float32", ", the vectors in the last, in float32") in caplog.text
    config.comm.vectors_last = False
    caplog.clear()
    model, tx, step = build_step(config, mesh)
    with caplog.at_level("INFO"):
        step.lower(state, batch)
    assert line in caplog.text


@pytest.mark.parametrize(
    "processes, local, nodes, after",
    [
        (2, "2", 2, True),  # launch_local.sh's processes of one host: its links carry the nodes
        (2, None, 2, False),  # a process per host: the nodes are across a network
        (4, "2", 4, False),  # 2 hosts of 2 processes
        (1, None, 2, False),  # one process emulating 2 nodes, as the tests' 2x4 meshes do
        (1, None, 1, True),
    ],
)
def test_auto_packs_after_backward_where_the_nodes_share_one_host(
    monkeypatch, processes, local, nodes, after
):
    # Before, 2 processes of one host packed during backward: 0.968 of one process's rate on 2
    # H200s, against 1.005 after backward (docs/benchmarks.md).
    monkeypatch.setattr(jax, "process_count", lambda: processes)
    environ = {} if local is None else {"JIA_JAX_LOCAL_PROCESSES": local}
    comm = ml_collections.ConfigDict({"pack_after_backward": "auto"})
    mesh = mesh_lib.create_mesh(nodes, 8 // nodes)
    assert train.packs_after_backward(comm, mesh, environ) is after
    comm.pack_after_backward = "never"  # an explicit choice stands
    assert train.packs_after_backward(comm, mesh, environ) is False


@pytest.mark.parametrize("concatenate", [True, False])
def test_concatenate_buckets_chooses_how_the_step_sends_its_buckets(monkeypatch, concatenate):
    config = tiny_config("flat")
    config.comm.concatenate_buckets = concatenate
    mesh = mesh_lib.create_mesh(2, 4)
    used = []  # (function, leaves of the tree it was given)
    for name in ("pack", "split"):
        real = getattr(allreduce, name)
        monkeypatch.setattr(
            allreduce, name,
            lambda tree, plan, n=name, f=real: used.append((n, len(jax.tree.leaves(tree))))
            or f(tree, plan),
        )
    model, tx, step = build_step(config, mesh)
    _, state = train.state_initializer(model, tx, mesh, (16, 16, 1), config.precision, seed=0)
    batch = {k: jax.device_put(v, mesh_lib.batch_sharding(mesh)) for k, v in global_batch().items()}
    step.lower(state, batch)
    # The gradients are packed (concatenated) or only split into their buckets' leaves; the
    # BatchNorm statistics and metrics, a tree of another size, are packed either way.
    grads = len(jax.tree.leaves(state.params))
    assert ("split", grads) in used
    assert (("pack", grads) in used) == concatenate
    assert any(n == "pack" and k != grads for n, k in used)


def test_an_unknown_pack_after_backward_stops_at_build():
    config = tiny_config("flat")
    config.comm.pack_after_backward = "sometimes"
    with pytest.raises(ValueError, match="comm.pack_after_backward='sometimes' is not one of"):
        build_step(config, mesh_lib.create_mesh(2, 4))


def _smoothed_cross_entropy_f64(logits: np.ndarray, labels: np.ndarray, smoothing: float):
    """Mean over examples of -sum_c t_c log softmax(z)_c, t = (1 - s) onehot + s / C, in float64."""
    z = np.asarray(logits, np.float64)
    log_p = z - z.max(-1, keepdims=True)
    log_p -= np.log(np.exp(log_p).sum(-1, keepdims=True))
    classes = z.shape[-1]
    targets = (1 - smoothing) * np.eye(classes)[labels] + smoothing / classes
    return float(np.mean(-(targets * log_p).sum(-1)))


def test_step_loss_is_the_label_smoothed_cross_entropy():
    """The loss the step trains on (its logged `loss`) is the config's label-smoothed one."""
    smoothing = 0.1
    config = tiny_config("flat")
    config.loss.label_smoothing = smoothing
    mesh = mesh_lib.create_mesh(2, 4)
    model, state, step = build(config, mesh)
    # Known parameters far from uniform logits (at init the softmax is near uniform, where the
    # smoothed and plain losses nearly agree): a classifier of N(0, 3^2) weights.
    head = state.params["classifier"]
    kernel = np.random.default_rng(3).normal(0.0, 3.0, head["kernel"].shape).astype(np.float32)
    head = {**head, "kernel": jax.device_put(kernel, head["kernel"].sharding)}
    state = state.replace(params={**state.params, "classifier": head})
    params, stats = jax.device_get((state.params, state.batch_stats))
    batch = global_batch()
    sharded = {k: jax.device_put(v, mesh_lib.batch_sharding(mesh)) for k, v in batch.items()}
    _, metrics = step(state, sharded)

    # Each device's BatchNorm batch is its 4-image slice (row-major over the mesh); the logged
    # loss is the mean of the devices' mean losses.
    apply = jax.jit(
        lambda x: model.apply(
            {"params": params, "batch_stats": stats}, x, train=True, mutable=["batch_stats"]
        )[0]
    )
    per_device = GLOBAL_BATCH // mesh.devices.size
    slices = [slice(i, i + per_device) for i in range(0, GLOBAL_BATCH, per_device)]
    logits = [np.asarray(apply(batch["image"][s])) for s in slices]

    def reference(s: float) -> float:
        return float(
            np.mean(
                [
                    _smoothed_cross_entropy_f64(z, batch["label"][i], s)
                    for z, i in zip(logits, slices)
                ]
            )
        )

    # The logits agree to fp32 rounding of values of ~10 (a different program, so other fusions):
    # ~1e-5 each; the loss moves by at most 2x the largest logit error (its gradient in the
    # logits, p - t, has an L1 norm <= 2). 1e-4 bounds that with room.
    loss = float(metrics["loss"])
    assert abs(loss - reference(smoothing)) < 1e-4, (loss, reference(smoothing))
    # The test can fail: without smoothing the loss is far outside that tolerance.
    assert abs(reference(smoothing) - reference(0.0)) > 1e-2, (reference(smoothing), reference(0.0))


@pytest.mark.parametrize("strategy", ["xla", "hierarchical"])
def test_a_stop_request_on_some_devices_reaches_every_device_and_changes_no_maths(strategy):
    # One process asks to stop (its 4 devices of the 2x4 mesh): the step's "stop" metric is the
    # fraction of devices asking (4/8, exact in fp32), the same for every process, and the
    # update equals a step without the flag bit for bit (the flag only rides along).
    mesh = mesh_lib.create_mesh(2, 4)
    config = tiny_config(strategy)
    _, state, step = build(config, mesh)
    host_state = jax.device_get(state)

    def fresh():  # the step donates its state
        return jax.device_put(host_state, mesh_lib.replicated_sharding(mesh))

    batch = {k: jax.device_put(v, mesh_lib.batch_sharding(mesh)) for k, v in global_batch().items()}
    asked = np.array([0, 0, 0, 0, 1, 1, 1, 1], np.int32)
    flags = jax.device_put(asked, mesh_lib.batch_sharding(mesh))
    flagged, metrics = jax.device_get(step(fresh(), batch, flags))
    assert metrics[train.STOP_KEY] == 0.5
    plain, plain_metrics = jax.device_get(step(fresh(), batch))
    assert train.STOP_KEY not in plain_metrics
    assert _tree_max_abs_diff(flagged.params, plain.params) == 0.0
    assert metrics["loss"] == plain_metrics["loss"]
    quiet = jax.device_get(step(fresh(), batch, train.stop_flags(mesh, False)))[1]
    assert quiet[train.STOP_KEY] == 0.0
    assert jax.device_get(step(fresh(), batch, train.stop_flags(mesh, True)))[1]["stop"] == 1.0
