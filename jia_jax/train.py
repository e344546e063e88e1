"""Train state and the jitted SPMD train / eval steps.

One `jax.jit` program per step. Inside it, a `shard_map` over both mesh axes runs the per-device
forward/backward on the device's slice of the batch with per-device BatchNorm statistics (Goyal et
al.), and reduces the gradients with the configured strategy (`jia_jax.allreduce`). The update
(loss-scale check, optimizer) then runs on the replicated fp32 master parameters.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jia_jax import allreduce, bucketing, comm_model, normalize, precision, xla_network
from jia_jax import loss as loss_lib
from jia_jax import mesh as mesh_lib
from jia_jax.models import call_order

Batch = dict[str, jax.Array]
Metrics = dict[str, jax.Array]
# The metric that says a process asked the run to stop (`make_train_step`'s `stop`).
STOP_KEY = "stop"


class TrainState(flax.struct.PyTreeNode):
    """Everything a step reads and writes; all replicated, all fp32 except counters."""

    step: jax.Array
    params: Any
    batch_stats: Any
    opt_state: optax.OptState
    loss_scale: precision.LossScaleState


def state_initializer(
    model: nn.Module,
    tx: optax.GradientTransformation,
    mesh: Mesh,
    image_shape: tuple[int, int, int],
    precision_cfg: ml_collections.ConfigDict,
    seed: int,
) -> tuple[Callable[[], TrainState], TrainState]:
    """The state's abstract form (shapes, dtypes, replicated shardings) and a function making it.

    The structure is found abstractly first (`jax.eval_shape`), so a run that resumes restores
    straight onto these shardings without ever initialising, and a fresh run compiles the init with
    its output shardings: the parameters are born on the devices where they live.

    Returns:
      `(init, abstract)`: `init()` returns the initial `TrainState`; `abstract` is a `TrainState` of
      `jax.ShapeDtypeStruct`s carrying the target shardings.
    """
    dynamic = precision.needs_loss_scaling(precision.compute_dtype(precision_cfg.compute))

    def init(key: jax.Array) -> TrainState:
        # Init at fp32 so params, stats and the optimizer state are the fp32 masters.
        variables = model.init(key, jnp.zeros((1, *image_shape), jnp.float32), train=False)
        params = variables["params"]
        return TrainState(
            step=jnp.zeros((), jnp.int32),
            params=params,
            batch_stats=variables["batch_stats"],
            opt_state=tx.init(params),
            loss_scale=precision.init_loss_scale(precision_cfg.loss_scale.initial, dynamic=dynamic),
        )

    key = jax.random.key(seed)
    replicated = mesh_lib.replicated_sharding(mesh)
    shapes = jax.eval_shape(init, key)
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated), shapes
    )
    init_on_mesh = jax.jit(init, out_shardings=jax.tree.map(lambda _: replicated, shapes))
    return (lambda: init_on_mesh(key)), abstract


def cast_floats(tree: Any, dtype: jnp.dtype) -> Any:
    """`tree` with its floating-point leaves cast to `dtype` (the compute copy of the params)."""
    return jax.tree.map(
        lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree
    )


def local_grads_fn(model: nn.Module, compute: jnp.dtype, smoothing: float) -> Callable:
    """`(low_params, batch_stats, scale, batch, key) -> (grads, new_stats, metrics)` of one batch.

    Gradients are taken with respect to the compute-dtype copy of the parameters, so they come
    out in that dtype (what the paper sends over the wire) instead of being upcast in backward.
    """

    def grads(low_params, batch_stats, scale, batch, key):
        def scaled_loss(p):
            logits, new_vars = model.apply(
                {"params": p, "batch_stats": batch_stats},
                normalize.model_input(batch["image"], compute),
                train=True,
                mutable=["batch_stats"],
                rngs={"dropout": key},
            )
            loss = jnp.mean(loss_lib.cross_entropy(logits, batch["label"], smoothing))
            return loss * scale, (loss, logits, new_vars["batch_stats"])

        g, (loss, logits, new_stats) = jax.grad(scaled_loss, has_aux=True)(low_params)
        metrics = {"loss": loss, "top1": jnp.mean(loss_lib.topk_correct(logits, batch["label"], 1))}
        return g, new_stats, metrics

    return grads


def accumulate_microbatches(grads_fn: Callable, microbatch: int, num_devices: int) -> Callable:
    """Wraps `grads_fn` to accumulate gradients over microbatches of `microbatch` images.

    A 64K global batch on a handful of GPUs: each microbatch is one BatchNorm batch, as it would
    be on a device of its own. The running statistics take one momentum step towards the mean of
    the microbatches' statistics, exactly what that many devices followed by a `pmean` compute:
    every microbatch starts from the same running averages, and their updates are averaged.
    """

    def accumulated(low_params, batch_stats, scale, batch, key):
        per_device_batch = batch["label"].shape[0]
        if not microbatch or microbatch >= per_device_batch:
            return grads_fn(low_params, batch_stats, scale, batch, key)
        if per_device_batch % microbatch:
            raise ValueError(
                f"microbatch_size={microbatch} must divide the per-device batch "
                f"({per_device_batch} = global_batch_size / {num_devices} devices)."
            )
        steps = per_device_batch // microbatch
        micro = jax.tree.map(lambda x: x.reshape(steps, microbatch, *x.shape[1:]), batch)

        def body(total, xs):
            mb, mb_key = xs
            g, stats, metrics = grads_fn(low_params, batch_stats, scale, mb, mb_key)
            return jax.tree.map(lambda t, x: t + x.astype(jnp.float32), total, g), (stats, metrics)

        zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), low_params)
        keys = jax.random.split(key, steps)
        total, (stats, metrics) = jax.lax.scan(body, zeros, (micro, keys))
        # Back to the compute dtype: the wire carries what a single pass would have produced.
        g = jax.tree.map(lambda t, p: (t / steps).astype(p.dtype), total, low_params)
        new_stats = jax.tree.map(lambda x: jnp.mean(x, axis=0), stats)
        return g, new_stats, jax.tree.map(jnp.mean, metrics)

    return accumulated


def device_index(mesh: Mesh) -> jax.Array:
    """This device's position in the (node, gpu) mesh, row-major; call inside `shard_map`."""
    gpus = mesh.shape[mesh_lib.GPU_AXIS]
    return jax.lax.axis_index(mesh_lib.NODE_AXIS) * gpus + jax.lax.axis_index(mesh_lib.GPU_AXIS)


PACK_AFTER_BACKWARD = ("auto", "always", "never")


def packs_after_backward(
    comm: ml_collections.ConfigDict, mesh: Mesh, environ: Mapping[str, str] = os.environ
) -> bool:
    """Whether the buckets are packed once backward has ended (`comm.pack_after_backward`).

    "auto" does where the mesh has one node, or where its nodes are processes of one host (as
    `environ`'s launcher variables say, `xla_network.one_host`): over one host's links the
    all-reduce after backward is short, and packing during backward made XLA fuse BatchNorm's
    backward worse (`allreduce.hold_until_backward_ends`; with the vectors packed among the
    kernels, measured before `comm.vectors_last`). Across hosts the buckets leave during
    backward, where the network's wire time hides under it. One process's mesh of several nodes
    (emulating them) packs during backward.
    """
    choice = comm.get("pack_after_backward", "auto")
    if choice not in PACK_AFTER_BACKWARD:
        raise ValueError(
            f"comm.pack_after_backward={choice!r} is not one of {PACK_AFTER_BACKWARD}."
        )
    if choice == "auto":
        processes = jax.process_count()
        return mesh.shape[mesh_lib.NODE_AXIS] == 1 or (
            processes > 1 and xla_network.one_host(processes, environ)
        )
    return choice == "always"


def late_buckets(comm: ml_collections.ConfigDict, after_backward: bool) -> tuple[int, bool]:
    """`comm.last_bucket_bytes` and `comm.release_before_last` as the step applies them.

    Both serve buckets that leave during backward, the last alone after it. Packed after
    backward (`packs_after_backward`) every bucket leaves at once, so neither is applied there:
    inside one host (2 H200s, one process) the 64K config's step with both kept 0.987 of two
    GPUs at 64 images per GPU against 1.014 without, and no more at 256 (docs/benchmarks.md,
    "Across hosts"). The communication model plans the same buckets (`resolve_comm`).
    """
    if after_backward:
        return 0, False
    return comm.get("last_bucket_bytes", 0), comm.get("release_before_last", False)


def _per_device_step(model, config, comm, mesh, image_shape):
    """The `shard_map`ped part of the step: local gradients, then their reduction by `comm`.

    Returns `f(params, batch_stats, scale, batch, key) -> (grads, new_stats, metrics)`. With
    `comm.strategy='xla'` each output is stacked along a device axis (its mean is left to XLA);
    otherwise all three are already averaged over the devices.
    """
    compute = precision.compute_dtype(config.precision.compute)
    grads_fn = accumulate_microbatches(
        local_grads_fn(model, compute, config.loss.label_smoothing),
        config.microbatch_size,
        mesh.devices.size,
    )
    xla_reduces = comm.strategy == "xla"
    leaf_order = None if xla_reduces else call_order.backward_leaf_order(model, image_shape)
    after_backward = packs_after_backward(comm, mesh)
    packed = comm.get("concatenate_buckets", True)
    vectors_last = comm.get("vectors_last", False)
    last, release = late_buckets(comm, after_backward)
    if not xla_reduces:
        logging.info(
            "gradients: %s all-reduce of %g MiB buckets%s%s in %s, %s, sent %s backward%s",
            comm.strategy, comm.bucket_bytes / comm_model.MIB,
            f" (the last of {last / comm_model.MIB:g} MiB)" if last else "",
            ", the vectors in the last," if vectors_last else "", comm.dtype,
            "concatenated" if bucketing.concatenated(packed, comm.dtype) else "as their leaves",
            "after" if after_backward else "during",
            ", the others updated under the last one's all-reduce" if release else "",
        )

    def per_device(params, batch_stats, scale, batch, key):
        batch = dict(batch)
        stop = batch.pop(STOP_KEY, None)
        low_params = cast_floats(params, compute)
        # A different dropout mask on every device (and microbatch), all a function of the step.
        key = jax.random.fold_in(key, device_index(mesh))
        grads, new_stats, metrics = grads_fn(low_params, batch_stats, scale, batch, key)
        if stop is not None:
            # Its mean over the devices is > 0 where any process asked to stop.
            metrics[STOP_KEY] = stop[0].astype(jnp.float32)
        if xla_reduces:
            # Hand per-device values out stacked along a device axis; their mean is written as
            # array code outside, so XLA chooses and combines the collectives itself.
            return jax.tree.map(lambda x: x[None], (grads, new_stats, metrics))
        grads = allreduce.reduce_gradients(
            grads,
            strategy=comm.strategy,
            bucket_bytes=comm.bucket_bytes,
            wire_dtype=comm.dtype,
            hybrid_crossover_bytes=comm.hybrid_crossover_bytes,
            node_axis=mesh_lib.NODE_AXIS,
            gpu_axis=mesh_lib.GPU_AXIS,
            leaf_order=leaf_order,
            overlap=comm.overlap,
            first_bucket_bytes=comm.first_bucket_bytes,
            last_bucket_bytes=last,
            after_backward=after_backward,
            packed=packed,
            release_before_last=release,
            vectors_last=vectors_last,
        )
        # Keep the running BN averages identical on every device (cheap: a few KB).
        new_stats, metrics = allreduce.pmean_packed((new_stats, metrics), mesh_lib.BATCH_AXES)
        return grads, new_stats, metrics

    reduced = P(mesh_lib.BATCH_AXES) if xla_reduces else P()
    return jax.shard_map(
        per_device,
        mesh=mesh,
        in_specs=(P(), P(), P(), P(mesh_lib.BATCH_AXES), P()),
        out_specs=(reduced, reduced, reduced),
        check_vma=False,
    )


def resolve_comm(
    comm: ml_collections.ConfigDict,
    model: nn.Module,
    mesh: Mesh,
    params: Any,
    image_shape: tuple[int, ...],
) -> ml_collections.ConfigDict:
    """`comm` with `strategy='auto'` and `bucket_bytes` / `hybrid_crossover_bytes` = -1 chosen.

    The communication model (`jia_jax.comm_model`, calibrated on this repo's benchmarks) picks
    the plan with the least predicted exposed reduction time for this mesh, gradient tree and
    wire dtype, over the links `comm.network` names (processes of one host,
    `xla_network.one_host`: NVLink only); the choice is logged. Explicit values are kept.
    """
    automatic = (
        comm.strategy == comm_model.AUTO
        or comm.bucket_bytes == comm_model.AUTO_BYTES
        or comm.hybrid_crossover_bytes == comm_model.AUTO_BYTES
    )
    if not automatic:
        return comm
    leaves = jax.tree.leaves(params)
    order = bucketing.packing_order(
        call_order.backward_leaf_order(model, image_shape),
        [len(leaf.shape) for leaf in leaves],
        comm.get("vectors_last", False),
    )
    # The buckets the step will send: a last bucket of their own only where it applies.
    last, _ = late_buckets(comm, packs_after_backward(comm, mesh))
    plan = comm_model.resolve(
        ml_collections.ConfigDict({**comm.to_dict(), "last_bucket_bytes": last}),
        node=mesh.shape[mesh_lib.NODE_AXIS],
        gpu=mesh.shape[mesh_lib.GPU_AXIS],
        leaf_sizes=[math.prod(leaves[i].shape) for i in order],
        model=comm_model.network_model(
            comm.get("network", ""),
            single_host=xla_network.one_host(jax.process_count(), os.environ),
        ),
    )
    logging.info("%s", plan.summary())
    resolved = ml_collections.ConfigDict(comm.to_dict())
    resolved.strategy = plan.strategy
    resolved.bucket_bytes = plan.bucket_bytes
    resolved.hybrid_crossover_bytes = plan.hybrid_crossover_bytes
    return resolved


def check_comm_sizes(comm: ml_collections.ConfigDict) -> None:
    """Raises a ValueError naming the field where a `comm` size is neither a byte count nor,
    where the communication model may choose it, -1."""
    for field, auto in (
        ("bucket_bytes", True),
        ("hybrid_crossover_bytes", True),
        ("first_bucket_bytes", False),
        ("last_bucket_bytes", False),
    ):
        value = comm.get(field, 0)
        if value < 0 and not (auto and value == comm_model.AUTO_BYTES):
            choose = f", or {comm_model.AUTO_BYTES} for the communication model's choice"
            raise ValueError(
                f"comm.{field}={value!r} must be a number of bytes >= 0{choose if auto else ''}."
            )


def schedule_count(state: TrainState) -> jax.Array:
    """The count the learning-rate schedule reads: updates applied so far.

    A skipped fp16 step (non-finite gradients) keeps the old optimizer state, so the schedule
    follows applied updates, not steps; with no count in the optimizer state, the step.
    """
    try:
        count = optax.tree_utils.tree_get(state.opt_state, "count")
    except KeyError:
        count = None
    return state.step if count is None else count


def update_fn(
    tx: optax.GradientTransformation,
    learning_rate: optax.Schedule,
    config: ml_collections.ConfigDict,
) -> Callable:
    """`(state, grads, new_stats, metrics) -> (state, metrics)`: unscale, update, loss scale."""
    dynamic_scale = precision.needs_loss_scaling(precision.compute_dtype(config.precision.compute))
    ls_cfg = config.precision.loss_scale

    def update(state, grads, new_stats, metrics):
        # The rate this update applies (a skipped update applies none, and does not advance it).
        metrics["learning_rate"] = jnp.asarray(learning_rate(schedule_count(state)), jnp.float32)
        grads = precision.unscale(grads, state.loss_scale)  # fp32 from here on
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        new = state.replace(
            step=state.step + 1, params=params, batch_stats=new_stats, opt_state=opt_state
        )
        if not dynamic_scale:
            return new, metrics
        # Every device holds the same reduced gradients, so all take the same decision.
        finite = precision.all_finite(grads)
        kept = (state.params, state.opt_state)
        params, opt_state = precision.select_tree(finite, (new.params, new.opt_state), kept)
        new = new.replace(
            params=params,
            opt_state=opt_state,
            batch_stats=precision.select_joined(finite, new_stats, state.batch_stats),
            loss_scale=precision.update_loss_scale(
                state.loss_scale,
                finite,
                growth_interval=ls_cfg.growth_interval,
                factor=ls_cfg.factor,
                minimum=ls_cfg.minimum,
            )
        )
        metrics["skipped"] = 1.0 - finite.astype(jnp.float32)
        metrics["loss_scale"] = new.loss_scale.scale
        return new, metrics

    return update


def make_train_step(
    model: nn.Module,
    tx: optax.GradientTransformation,
    learning_rate: optax.Schedule,
    config: ml_collections.ConfigDict,
    mesh: Mesh,
) -> Callable[..., tuple[TrainState, Metrics]]:
    """Returns the jitted `step(state, batch, stop=None) -> (state, metrics)`; `state` is donated.

    Three pieces, in order: per-device gradients (forward/backward, microbatches), their
    reduction over the mesh (`comm.strategy`), the fp32 update of the replicated state.

    `stop`, if given, is a per-device int array sharded like the batch (`stop_flags`): 1 where
    the device's process asks the run to stop. `metrics["stop"]` is then its mean over the
    devices, reduced with the other metrics, so every process learns of a request anywhere from
    the metrics it fetches anyway: no collective or host wait of its own.

    Args:
      model: the flax module, built with the compute dtype.
      tx: the optimizer (runs in fp32 on the reduced, unscaled gradients).
      learning_rate: the schedule, only for logging it.
      config: the run config (`precision`, `loss`, `comm` blocks and `microbatch_size` are read).
      mesh: the ("node", "gpu") mesh.
    """
    known = ("xla", comm_model.AUTO, *allreduce.STRATEGIES)
    if config.comm.strategy not in known:
        raise ValueError(f"comm.strategy={config.comm.strategy!r} is not one of {known}.")
    comm_model.network_model(config.comm.get("network", ""))  # a bad name fails here, not later
    packs_after_backward(config.comm, mesh)  # so does a bad pack_after_backward
    check_comm_sizes(config.comm)  # and a bad size, whether or not the strategy reads it
    if precision.needs_loss_scaling(precision.compute_dtype(config.precision.compute)):
        precision.check_loss_scale(config.precision.loss_scale)
    if not 0.0 <= config.loss.label_smoothing < 1.0:
        raise ValueError(
            f"loss.label_smoothing={config.loss.label_smoothing} must be in [0, 1)."
        )
    update = update_fn(tx, learning_rate, config)
    built = {}  # per image shape: (comm, shard_mapped step); shapes are known when tracing

    def step(
        state: TrainState, batch: Batch, stop: jax.Array | None = None
    ) -> tuple[TrainState, Metrics]:
        image_shape = batch["image"].shape[1:]
        if stop is not None:
            batch = {**batch, STOP_KEY: stop}
        if image_shape not in built:
            comm = resolve_comm(config.comm, model, mesh, state.params, image_shape)
            built[image_shape] = comm, _per_device_step(model, config, comm, mesh, image_shape)
        comm, sharded = built[image_shape]
        # Dropout randomness is a function of (seed, step): a resumed run draws the same masks.
        key = jax.random.fold_in(jax.random.PRNGKey(config.seed), state.step)
        grads, new_stats, metrics = sharded(
            state.params, state.batch_stats, state.loss_scale.scale, batch, key
        )
        if comm.strategy == "xla":
            grads = allreduce.stacked_mean(grads, comm.dtype)
            new_stats, metrics = jax.tree.map(lambda x: jnp.mean(x, axis=0), (new_stats, metrics))
        return update(state, grads, new_stats, metrics)

    # What XLA's estimator was told is what XLA_FLAGS held when JAX started (jia_jax.main adds it).
    xla_told = bool(xla_network.told(os.environ.get("XLA_FLAGS", "")))
    options = step_compiler_options(config.comm, xla_told)
    return jax.jit(step, donate_argnums=0, compiler_options=options)


def step_compiler_options(comm: ml_collections.ConfigDict, xla_told: bool) -> dict[str, Any] | None:
    """XLA options of the train step's compilation, for explicit strategies: no combining of
    concatenated buckets (each is one collective already), and combining capped at the bucket
    size for buckets sent as their leaves, where `comm.start_when_ready`, or
    `comm.tell_xla_network` where XLA's estimator was told the network (`xla_told`), asks for the
    buckets to leave apart; with `comm.start_when_ready` XLA's speed-of-light estimator off.

    XLA's latency-hiding scheduler, which its speed-of-light estimator turns on for GPUs since
    Hopper, starts a collective only as early as its estimate of the collective's time needs.
    Across a network it underestimates unless told the network (`comm.tell_xla_network`,
    jia_jax/xla_network.py, which tells it only in runs across hosts), and the buckets
    leave late in backward. Told, it starts each bucket where backward has packed it, so each is
    kept apart: combined, a bucket waits for the one backward packs last. With the estimator off
    (`comm.start_when_ready`), XLA issues each all-reduce right after its operand. Any cap lets
    XLA join buckets smaller together than it: capped at 16 MiB it joined a small last bucket
    (`comm.last_bucket_bytes`) to the one before it. Measured across emulated hosts
    (docs/benchmarks.md, "Across hosts").
    """
    ready = comm.get("start_when_ready", False)
    told = comm.get("tell_xla_network", False) and xla_told
    if not (ready or told) or comm.strategy == "xla":
        return None
    if bucketing.concatenated(comm.get("concatenate_buckets", True), comm.dtype):
        cap = 0
    else:
        cap = max(comm.bucket_bytes, 0)  # 'auto' (-1) resolves later: no combining at all
    options: dict[str, Any] = {
        f"xla_gpu_{kind}_combine_threshold_bytes": cap
        for kind in ("all_reduce", "reduce_scatter", "all_gather")
    }
    if ready:
        options["xla_gpu_enable_analytical_sol_latency_estimator"] = False
    return options


def stop_flags(mesh: Mesh, requested: bool) -> jax.Array:
    """This process's stop request on each of its devices, sharded like a batch (`make_train_step`).

    Built from local values only, so each process may pass its own.
    """
    devices = mesh.devices.size
    sharding = NamedSharding(mesh, P(mesh_lib.BATCH_AXES))
    return jax.make_array_from_callback(
        (devices,),
        sharding,
        lambda index: np.full(np.empty(devices)[index].shape, int(requested), np.int32),
    )


def make_eval_step(
    model: nn.Module, config: ml_collections.ConfigDict, mesh: Mesh
) -> Callable[[TrainState, Batch], Metrics]:
    """Returns the jitted `eval_step(state, batch) -> sums` of loss, top-1, top-5 and count.

    Padded examples (`mask` 0) contribute nothing, so summing over batches counts each example
    of the split exactly once.
    """
    compute = precision.compute_dtype(config.precision.compute)

    def per_device(params, batch_stats, batch):
        logits = model.apply(
            {"params": cast_floats(params, compute), "batch_stats": batch_stats},
            normalize.model_input(batch["image"], compute),
            train=False,
        )
        mask = batch["mask"]
        sums = {
            "loss": jnp.sum(loss_lib.cross_entropy(logits, batch["label"]) * mask),
            "top1": jnp.sum(loss_lib.topk_correct(logits, batch["label"], 1) * mask),
            "top5": jnp.sum(loss_lib.topk_correct(logits, batch["label"], 5) * mask),
            "count": jnp.sum(mask),
        }
        return jax.lax.psum(sums, mesh_lib.BATCH_AXES)

    sharded = jax.shard_map(
        per_device,
        mesh=mesh,
        in_specs=(P(), P(), P(mesh_lib.BATCH_AXES)),
        out_specs=P(),
        check_vma=False,
    )
    return jax.jit(lambda state, batch: sharded(state.params, state.batch_stats, batch))
