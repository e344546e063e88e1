"""The training loop: config in; trained, checkpointed, evaluated and logged state out."""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections.abc import Callable

import flax.linen as nn
import jax
import ml_collections
import optax
from absl import logging

from jia_jax import checkpoint
from jia_jax import input_pipeline
from jia_jax import liveness
from jia_jax import mesh as mesh_lib
from jia_jax import metrics as metrics_lib
from jia_jax import models
from jia_jax import optimizers
from jia_jax import precision
from jia_jax import preemption as preemption_lib
from jia_jax import recipe
from jia_jax import schedules
from jia_jax import train

_DIVERGED_HINT = (
    "Nothing was saved for this step: the newest checkpoint is the last finite state. Try a lower "
    "optimizer.learning_rate or a longer optimizer.warmup_epochs."
)


def check_schedule_fields(config: ml_collections.ConfigDict) -> None:
    """Refuses the loop's intervals, `microbatch_size` and `profile` values that fail once
    training runs.

    Raises:
      ValueError: naming the field.
    """
    for field in ("log_every_steps", "eval_every_steps"):
        if config[field] < 1:
            raise ValueError(f"{field}={config[field]} must be >= 1.")
    if config.microbatch_size < 0:
        raise ValueError(
            f"microbatch_size={config.microbatch_size} must be >= 0 (0: no accumulation)."
        )
    if config.profile.first_step >= 0 and config.profile.steps < 1:
        raise ValueError(f"profile.steps={config.profile.steps} must be at least 1.")


def open_checkpointer(workdir: str, config: ml_collections.ConfigDict) -> checkpoint.Checkpointer:
    """The run's `Checkpointer`, in ``<workdir>/checkpoints`` (created if missing).

    Raises:
      OSError: naming --workdir and the system's reason, if the directory cannot be created.
    """
    directory = os.path.join(os.path.abspath(workdir), "checkpoints")
    try:
        return checkpoint.Checkpointer(
            directory,
            max_to_keep=config.checkpoint_keep,
            save_every_steps=config.checkpoint_every_steps,
        )
    except OSError as error:
        raise OSError(
            f"--workdir={workdir}: cannot create {directory} ({error.strerror or error}); give a "
            "directory you can write to (it is created if missing)."
        ) from error


def total_steps(config: ml_collections.ConfigDict, num_train: int) -> int:
    """`total_steps`, or `num_epochs` worth of steps when it is -1."""
    if config.total_steps > 0:
        return config.total_steps
    if config.num_epochs <= 0:
        raise ValueError("Set total_steps > 0 or num_epochs > 0.")
    return max(1, math.ceil(config.num_epochs * num_train / config.global_batch_size))


@dataclasses.dataclass(frozen=True)
class Trainer:
    """What a run is built from: data, model, optimizer and the state's initialiser."""

    data: input_pipeline.Input
    steps: int
    model: nn.Module
    schedule: optax.Schedule
    tx: optax.GradientTransformation
    init_state: Callable[[], train.TrainState]
    abstract_state: train.TrainState


def build_trainer(config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh) -> Trainer:
    """Builds the data streams, model, schedule, optimizer and state initialiser of `config`.

    The one place a config turns into a training setup, shared by the loop and the benchmarks,
    so that they measure exactly the trainer's program.
    """
    data = input_pipeline.create_input(
        config.data,
        config.global_batch_size,
        config.eval_batch_size,
        mesh,
        config.seed,
    )
    steps = total_steps(config, data.info.num_train)
    compute = precision.compute_dtype(config.precision.compute)
    precision.check_wire_dtype(config.comm.dtype, compute)
    model_kwargs = {k: v for k, v in config.model.items() if k != "name"}
    model = models.create_model(
        config.model.name, num_classes=data.info.num_classes, dtype=compute, **model_kwargs
    )
    schedule = schedules.schedule_from_config(
        config.optimizer, data.info.num_train, config.global_batch_size, steps
    )
    tx = optimizers.create_optimizer(config.optimizer, schedule)
    image_shape = (config.data.image_size, config.data.image_size, data.info.channels)
    init_state, abstract_state = train.state_initializer(
        model, tx, mesh, image_shape, config.precision, config.seed
    )
    return Trainer(data, steps, model, schedule, tx, init_state, abstract_state)


class Tracing:
    """A `jax.profiler` trace of the steps `profile.first_step` .. + `profile.steps` - 1.

    The steps before the first are waited for, so the trace holds those steps and only those.
    """

    def __init__(self, profile: ml_collections.ConfigDict, log_dir: str) -> None:
        self._first, self._end, self._log_dir = (
            profile.first_step,
            profile.first_step + profile.steps,
            log_dir,
        )
        self._running = False

    def before(self, step: int, state: train.TrainState) -> None:
        """Call before dispatching `step`; `state` is the input of that step."""
        if step == self._first:
            jax.block_until_ready(state)
            jax.profiler.start_trace(self._log_dir)
            self._running = True
        elif step == self._end:
            self.stop(state)

    def stop(self, state: train.TrainState) -> None:
        """Ends the trace once `state` is computed (also where the run ends inside it)."""
        if not self._running:
            return
        jax.block_until_ready(state)
        jax.profiler.stop_trace()
        self._running = False
        logging.info("profile of steps %d-%d in %s", self._first, self._end - 1, self._log_dir)


def evaluate(eval_step, state: train.TrainState, data: input_pipeline.Input) -> dict[str, float]:
    """Top-1 / top-5 / loss over the whole eval split, each example counted once."""
    sums = None
    for batch in data.eval():
        out = eval_step(state, batch)
        sums = out if sums is None else jax.tree.map(lambda a, b: a + b, sums, out)
    sums = jax.device_get(sums)
    count = float(sums["count"])
    return {
        "eval/loss": float(sums["loss"]) / count,
        "eval/top1": float(sums["top1"]) / count,
        "eval/top5": float(sums["top5"]) / count,
        "eval/examples": count,
    }


def _resume_or_start(
    ckpt: checkpoint.Checkpointer, trainer: Trainer, config: ml_collections.ConfigDict, devices: int
) -> tuple[int, train.TrainState]:
    """``(step, state)`` of the newest checkpoint, checked to belong to this run; else a new one."""
    restored = ckpt.restore_latest(trainer.abstract_state)
    if restored is None:
        return 0, trainer.init_state()
    step, state, meta = restored
    recipe.check_resume(
        meta,
        recipe.of_run(config.to_json(), devices),
        allow_change=config.allow_config_change,
        step=step,
        directory=str(ckpt.directory),
    )
    # One saved before saves were checked may hold a diverged state: never train on (or score) it.
    metrics_lib.check_state_finite(
        step,
        state,
        f"Move {ckpt.directory / str(step)} away to resume from the checkpoint before it, or use "
        "a new --workdir.",
    )
    logging.info("resumed from the checkpoint of step %d in %s", step, ckpt.directory)
    return step, state


def connect(config: ml_collections.ConfigDict) -> tuple[liveness.PeerWatch, jax.sharding.Mesh]:
    """Joins the other processes of the job (if any) and builds the mesh of `config`.

    Returns:
      The watch over the other processes (`mesh.initialize_distributed`) and the mesh.
    """
    peers = mesh_lib.initialize_distributed(config.distributed)
    mesh = mesh_lib.create_mesh(config.mesh.node, config.mesh.gpu)
    logging.info(
        "mesh %s over %d %s devices, %d processes",
        dict(mesh.shape),
        mesh.devices.size,
        jax.devices()[0].device_kind,
        jax.process_count(),
    )
    return peers, mesh


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
    """Trains `config` in `workdir`, resuming from its latest checkpoint if there is one.

    Returns:
      The last logged train metrics and the final evaluation (if the dataset has an eval split).
    """
    peers, mesh = connect(config)
    check_schedule_fields(config)
    trainer = build_trainer(config, mesh)
    data, steps = trainer.data, trainer.steps
    # Built (and its limit checked) before the workdir is touched.
    overflow = metrics_lib.OverflowWatch(
        minimum=config.precision.loss_scale.minimum,
        limit=config.precision.loss_scale.max_skips_at_minimum,
    )
    train_step = train.make_train_step(trainer.model, trainer.tx, trainer.schedule, config, mesh)
    eval_step = train.make_eval_step(trainer.model, config, mesh) if data.eval else None

    ckpt = open_checkpointer(workdir, config)
    writer = metrics_lib.MetricsWriter(workdir)
    preemption = preemption_lib.PreemptionHandler()
    # If another process dies, `peers` ends this one with a line naming the newest checkpoint.
    resume_step = functools.partial(liveness.newest_checkpoint, ckpt.directory)
    with peers.reporting(resume_step), ckpt, writer, preemption:
        start_step, state = _resume_or_start(ckpt, trainer, config, mesh.devices.size)

        def save(step: int, force: bool = False) -> None:
            if not ckpt.should_save(step, force=force):
                return
            # Commit only what was checked finite: this step's loss (the save waits for the step
            # anyway), then the state itself, which fp16 keeps finite by skipping steps.
            log(pending.flush())
            metrics_lib.check_state_finite(step, state, _DIVERGED_HINT)
            # The data position is the step: every train stream is a pure function of (seed, step).
            meta = {
                "step": step,
                "seed": config.seed,
                "config": config.to_json(),
                "num_devices": mesh.devices.size,
            }
            ckpt.save(step, state, meta, force=force)
            progress.restart(step)  # a save (and its wait for the previous one) is not training

        progress = metrics_lib.ProgressMeter(
            total_steps=steps, start_step=start_step, global_batch_size=config.global_batch_size
        )
        # fp16 skips non-finite steps by itself (loss scaling); other dtypes stop on a non-finite loss.
        pending = metrics_lib.LaggedFetch(
            finite_keys=()
            if precision.needs_loss_scaling(precision.compute_dtype(config.precision.compute))
            else ("loss",)
        )
        results: dict[str, float] = {}

        def log(fetched: tuple[int, dict[str, float]] | None) -> None:
            # `fetched`: a step's metrics, one step late (or at a save, the step just done).
            if fetched is None:
                return
            step, values = fetched
            values = {k: v for k, v in values.items() if k != train.STOP_KEY}
            overflow.update(step, values)
            if step == start_step + 1:
                # The first step compiled (after the restore of a checkpoint, if resumed).
                progress.restart(step)
            if step % config.log_every_steps and step != steps:
                return
            throughput = progress.measure(step)
            results.update({f"train/{k}": v for k, v in values.items()})
            if throughput is not None:
                results["train/images_per_sec"] = throughput.images_per_sec
            writer.write_scalars(step, results)
            logging.info(metrics_lib.format_progress(step, steps, values, throughput))

        batches = data.train(start_step)
        # A stop signal travels inside the step (`train.make_train_step`'s `stop`): no collective
        # or host wait of its own. Both flag arrays are made once: no transfer per step.
        stop_flags = {asked: train.stop_flags(mesh, asked) for asked in (False, True)}
        profile_dir = os.path.join(workdir, "profile", f"process_{jax.process_index()}")
        tracing = Tracing(config.profile, os.path.abspath(profile_dir))
        for step in range(start_step, steps):
            tracing.before(step, state)
            state, device_metrics = train_step(
                state, next(batches), stop_flags[preemption.requested]
            )
            done = step + 1
            peers.step = done
            # Fetching the previous step's scalars every step keeps at most two steps in flight.
            fetched = pending.push(done, device_metrics)
            log(fetched)
            # Every process fetches the same step's metrics here, so all stop at the same step.
            if fetched is not None and fetched[1][train.STOP_KEY] > 0:
                save(done, force=True)
                logging.warning(
                    "Preemption signal: saved the checkpoint of step %d; exiting.", done
                )
                return results
            save(done, force=done == steps)
            if eval_step is not None and done % config.eval_every_steps == 0 and done != steps:
                results.update(evaluate(eval_step, state, data))
                writer.write_scalars(done, results)
                logging.info("step %d: eval top-1 %.4f", done, results["eval/top1"])
                progress.restart(done)
        tracing.stop(state)
        log(pending.flush())
        if eval_step is not None:
            results.update(evaluate(eval_step, state, data))
            writer.write_scalars(steps, results)
            logging.info(
                "final eval at step %d: top-1 %.4f, top-5 %.4f over %d examples",
                steps,
                results["eval/top1"],
                results["eval/top5"],
                results["eval/examples"],
            )
    return results
