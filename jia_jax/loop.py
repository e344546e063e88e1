"""The training loop: config in; trained, checkpointed, evaluated and logged state out."""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import time
from collections.abc import Callable, Iterator

import flax.linen as nn
import jax
import ml_collections
import optax
from absl import logging

from jia_jax import checkpoint
from jia_jax import gc_freeze
from jia_jax import input_pipeline
from jia_jax import liveness
from jia_jax import mesh as mesh_lib
from jia_jax import metrics as metrics_lib
from jia_jax import models
from jia_jax import optimizers
from jia_jax import peer_watch
from jia_jax import precision
from jia_jax import preemption as preemption_lib
from jia_jax import recipe
from jia_jax import schedules
from jia_jax import step_graphs
from jia_jax import train
from jia_jax import workdir_lock

# Steps dispatched after step t before the loop waits for t's metrics: the host then has that many
# steps' time to hand the device the next one while other threads take the CPU (measured at 64
# images a GPU: docs/input_pipeline.md). XLA's CPU collectives deadlock with hundreds of steps
# dispatched and no wait; a wait every step for the step METRICS_LAG back bounds them.
METRICS_LAG = 2

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
        raise workdir_lock.cannot_create(workdir, directory, error) from error


def total_steps(config: ml_collections.ConfigDict, num_train: int) -> int:
    """`total_steps`, or `num_epochs` worth of steps when it is -1."""
    if config.total_steps > 0:
        return config.total_steps
    if config.total_steps != -1:  # else 0 trained num_epochs' worth, silently
        raise ValueError(
            f"total_steps={config.total_steps} must be > 0, or -1 for num_epochs' worth of steps."
        )
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
    precision.check_wire_dtype(config.comm.dtype, compute, config.comm.strategy)
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


# The progress lines after this one time steps slowed by the trace (and its start, which waits
# for every step dispatched).
TRACE_STARTS = "tracing steps"


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
        self._options = jax.profiler.ProfileOptions()
        # Python's tracer times every Python call of every thread, which slows the host's part
        # of each step: off, the device's idle time is what an untraced run has.
        self._options.python_tracer_level = int(profile.get("python", True))
        self._running = False

    def before(self, step: int, state: train.TrainState) -> None:
        """Call before dispatching `step`; `state` is the input of that step."""
        if step == self._first:
            jax.block_until_ready(state)
            logging.info("%s %d-%d", TRACE_STARTS, self._first, self._end - 1)
            jax.profiler.start_trace(self._log_dir, profiler_options=self._options)
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


def connect(config: ml_collections.ConfigDict) -> tuple[peer_watch.PeerWatch, jax.sharding.Mesh]:
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


class _TrainRun:
    """One run after its restore: the state being trained and what saves, logs and evaluates it.

    `save`, `log` and the step loop share the state, the held metrics, the progress meter and the
    results; this object owns them so each piece reads on its own.
    """

    def __init__(
        self,
        config: ml_collections.ConfigDict,
        mesh: jax.sharding.Mesh,
        trainer: Trainer,
        ckpt: checkpoint.Checkpointer,
        writer: metrics_lib.MetricsWriter,
        overflow: metrics_lib.OverflowWatch,
        eval_step: Callable | None,
        start_step: int,
        state: train.TrainState,
    ) -> None:
        self.config, self.mesh, self.trainer = config, mesh, trainer
        self.ckpt, self.writer, self.overflow, self.eval_step = ckpt, writer, overflow, eval_step
        self.start_step, self.state = start_step, state
        self.progress = metrics_lib.ProgressMeter(
            total_steps=trainer.steps,
            start_step=start_step,
            global_batch_size=config.global_batch_size,
            stages=trainer.data.stages,
        )
        # fp16 skips non-finite steps by itself (loss scaling); other dtypes stop on a
        # non-finite loss.
        self.pending = metrics_lib.LaggedFetch(
            finite_keys=()
            if precision.needs_loss_scaling(precision.compute_dtype(config.precision.compute))
            else ("loss",),
            lag=METRICS_LAG,
        )
        self.results: dict[str, float] = {}
        # Frozen once the first step has compiled: what is built by then lives for the run.
        self.gc = gc_freeze.GcFreeze()

    def save(self, step: int, force: bool = False) -> None:
        """Checkpoints `step` if the checkpointer's interval (or `force`) asks for it."""
        if not self.ckpt.should_save(step, force=force):
            return
        # Commit only what was checked finite: this step's loss (the save waits for the step
        # anyway), then the state itself, which fp16 keeps finite by skipping steps.
        self.log_held()
        metrics_lib.check_state_finite(step, self.state, _DIVERGED_HINT)
        # The data position is the step: every train stream is a pure function of (seed, step).
        meta = {
            "step": step,
            "seed": self.config.seed,
            "config": self.config.to_json(),
            "num_devices": self.mesh.devices.size,
        }
        self.ckpt.save(step, self.state, meta, force=force)
        self.progress.restart(step)  # a save (and its wait for the previous one) is not training

    def log_held(self) -> None:
        """Fetches and logs every step whose metrics are still held, oldest first."""
        for fetched in self.pending.flush():
            self.log(fetched)

    def log(self, fetched: metrics_lib.HostMetrics | None) -> None:
        """Watches `fetched` for overflow and, on a log step, writes and prints it."""
        # `fetched`: a step's metrics, METRICS_LAG steps late (or at a save, those held).
        if fetched is None:
            return
        steps = self.trainer.steps
        step, values = fetched
        values = {k: v for k, v in values.items() if k != train.STOP_KEY}
        self.overflow.update(step, values)
        if step == self.start_step + 1:
            # The first step compiled (after the restore of a checkpoint, if resumed).
            self.gc.freeze()
            self.progress.restart(step)
        if step % self.config.log_every_steps and step != steps:
            return
        throughput = self.progress.measure(step)
        self.results.update({f"train/{k}": v for k, v in values.items()})
        if throughput is not None:
            self.results["train/images_per_sec"] = throughput.images_per_sec
            self.results["train/input_wait_fraction"] = throughput.input_wait_fraction
            if throughput.launch_ms is not None:
                self.results["train/launch_ms"] = throughput.launch_ms
            for stage, ms in throughput.input_stages_ms.items():
                self.results[f"train/input_{stage}_ms"] = ms
        self.writer.write_scalars(step, self.results)
        logging.info(metrics_lib.format_progress(step, steps, values, throughput))

    def _evaluate(self, step: int) -> None:
        """Adds the eval split's metrics at `step` to the results and writes them."""
        self.results.update(evaluate(self.eval_step, self.state, self.trainer.data))
        self.writer.write_scalars(step, self.results)

    def next_batch(self, batches: Iterator[input_pipeline.Batch]) -> input_pipeline.Batch:
        """The next batch; the time blocked on it counts as input wait in the progress meter."""
        # With input ahead of the step (the GPU path's producer thread), this returns at once;
        # a wait here means the input, not the device, is the slower side.
        start = time.perf_counter()
        batch = next(batches)
        self.progress.add_input_wait(time.perf_counter() - start)
        return batch

    def run_steps(
        self,
        train_step: Callable,
        peers: peer_watch.PeerWatch,
        preemption: preemption_lib.PreemptionHandler,
        profile_dir: str,
    ) -> bool:
        """Trains to the last step, saving and evaluating on the way.

        Returns:
          False if a preemption signal stopped the run (its checkpoint saved), else True.
        """
        batches = self.trainer.data.train(self.start_step)
        # A stop signal travels inside the step (`train.make_train_step`'s `stop`): no collective
        # or host wait of its own. Both flag arrays are made once: no transfer per step.
        stop_flags = {asked: train.stop_flags(self.mesh, asked) for asked in (False, True)}
        tracing = Tracing(self.config.profile, os.path.abspath(profile_dir))
        with self.gc:  # every step's metrics are logged inside: the freeze is undone after
            if not self._steps(train_step, peers, preemption, tracing, batches, stop_flags):
                return False
            tracing.stop(self.state)
            self.log_held()
        return True

    def _steps(
        self,
        train_step: Callable,
        peers: peer_watch.PeerWatch,
        preemption: preemption_lib.PreemptionHandler,
        tracing: Tracing,
        batches: Iterator[input_pipeline.Batch],
        stop_flags: dict[bool, jax.Array],
    ) -> bool:
        """`run_steps`' loop: False if a preemption signal stopped it (its checkpoint saved)."""
        steps = self.trainer.steps
        for step in range(self.start_step, steps):
            tracing.before(step, self.state)
            batch = self.next_batch(batches)
            start = time.perf_counter()
            self.state, device_metrics = train_step(
                self.state, batch, stop_flags[preemption.requested]
            )
            self.progress.add_launch(time.perf_counter() - start)
            done = step + 1
            peers.step = done
            # Fetching step done - METRICS_LAG's scalars every step bounds the steps in flight.
            fetched = self.pending.push(done, device_metrics)
            self.log(fetched)
            # Every process fetches the same step's metrics here, so all stop at the same step.
            if fetched is not None and fetched[1][train.STOP_KEY] > 0:
                self.save(done, force=True)
                logging.warning(
                    "Preemption signal: saved the checkpoint of step %d; exiting.", done
                )
                return False
            self.save(done, force=done == steps)
            if (
                self.eval_step is not None
                and done % self.config.eval_every_steps == 0
                and done != steps
            ):
                self._evaluate(done)
                logging.info("step %d: eval top-1 %.4f", done, self.results["eval/top1"])
                self.progress.restart(done)
        return True

    def final_eval(self) -> None:
        """Evaluates the trained state at the last step, if the dataset has an eval split."""
        if self.eval_step is None:
            return
        steps = self.trainer.steps
        self._evaluate(steps)
        logging.info(
            "final eval at step %d: top-1 %.4f, top-5 %.4f over %d examples",
            steps,
            self.results["eval/top1"],
            self.results["eval/top5"],
            self.results["eval/examples"],
        )


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
    """Trains `config` in `workdir`, resuming from its latest checkpoint if there is one.

    Returns:
      The last logged train metrics and the final evaluation (if the dataset has an eval split).
    """
    peers, mesh = connect(config)
    check_schedule_fields(config)
    trainer = build_trainer(config, mesh)
    # Built (and its limit checked) before the workdir is touched.
    overflow = metrics_lib.OverflowWatch(
        minimum=config.precision.loss_scale.minimum,
        limit=config.precision.loss_scale.max_skips_at_minimum,
    )
    train_step = step_graphs.for_training(
        train.make_train_step(trainer.model, trainer.tx, trainer.schedule, config, mesh),
        config.launch.convolution_graphs,
        os.environ.get("XLA_FLAGS", ""),
    )
    eval_step = train.make_eval_step(trainer.model, config, mesh) if trainer.data.eval else None

    # Held from before the workdir's first write to the run's end: a second run stops here.
    with workdir_lock.held(workdir, primary=jax.process_index() == 0):
        ckpt = open_checkpointer(workdir, config)
        writer = metrics_lib.MetricsWriter(workdir)
        preemption = preemption_lib.PreemptionHandler()
        # If another process dies, `peers` ends this one with a line naming the newest checkpoint.
        resume_step = functools.partial(liveness.newest_checkpoint, ckpt.directory)
        with peers.reporting(resume_step), ckpt, writer, preemption:
            start_step, state = _resume_or_start(ckpt, trainer, config, mesh.devices.size)
            run = _TrainRun(
                config, mesh, trainer, ckpt, writer, overflow, eval_step, start_step, state
            )
            profile_dir = os.path.join(workdir, "profile", f"process_{jax.process_index()}")
            if run.run_steps(train_step, peers, preemption, profile_dir):
                run.final_eval()
    return run.results
