"""Training metrics: lagged device-to-host fetch, progress lines and TensorBoard scalars.

The loop never blocks on the step it just dispatched: `LaggedFetch` hands back step t's metrics
only after step t+1 (or t+lag) is queued, so the device always has work while the host logs::

  lagged = LaggedFetch()
  meter = ProgressMeter(total_steps=n, global_batch_size=b, start_step=start)
  with MetricsWriter(workdir) as writer:
    for step in range(start, n):
      start_wait = time.perf_counter()
      batch = next(batches)
      meter.add_input_wait(time.perf_counter() - start_wait)
      state, metrics = train_step(state, batch)  # dispatched, not finished
      fetched = lagged.push(step, metrics, fetch=step % log_every_steps == 0)
      if fetched is not None:
        done_step, values = fetched
        throughput = meter.measure(done_step)
        logging.info(format_progress(done_step, n, values, throughput))
        writer.write_scalars(done_step, {"train/" + k: v for k, v in values.items()}
                             | {"train/images_per_sec": throughput.images_per_sec,
                                "train/input_wait_fraction": throughput.input_wait_fraction})

Tags written by the trainer:
``train/{loss,lr,accuracy,images_per_sec,input_wait_fraction,launch_ms,loss_scale}``, on the GPU
input path ``train/input_{read,decode}_ms`` (`stage_clock`), and ``eval/{top1,top5}``.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Self

import jax
import jax.numpy as jnp
import numpy as np
import tensorboardX
from etils import epath

from jia_jax import stage_clock

HostMetrics = tuple[int, dict[str, float]]
# How many non-finite leaves an error names before counting the rest.
_MAX_LISTED_LEAVES = 5


class NonFiniteLossError(FloatingPointError):
    """Training diverged: the loss, or the state about to be checkpointed, holds inf or NaN."""


def check_finite(step: int, metrics: Mapping[str, float], keys: Sequence[str]) -> None:
    """Raises `NonFiniteLossError` naming the step if any of `keys` is inf or NaN.

    Args:
      step: The step the metrics belong to.
      metrics: Host metrics of that step.
      keys: Names of the metrics to check; names absent from `metrics` are skipped.
    """
    bad = {k: metrics[k] for k in keys if k in metrics and not math.isfinite(metrics[k])}
    if bad:
        values = ", ".join(f"{k} = {v}" for k, v in bad.items())
        raise NonFiniteLossError(
            f"Training diverged at step {step}: {values}. Try a lower optimizer.learning_rate "
            "or a longer optimizer.warmup_epochs; with precision.compute='float16' check the "
            "loss scale settings. No checkpoint was saved from this step on: rerunning with the "
            "same --workdir resumes from the newest one."
        )


@jax.jit
def _finite_per_leaf(leaves: list[jax.Array]) -> jax.Array:
    return jnp.stack([jnp.all(jnp.isfinite(leaf)) for leaf in leaves])


def non_finite_leaves(tree: Any) -> list[str]:
    """Paths of the floating-point leaves of `tree` holding an inf or NaN.

    Reduced on the devices; only one bool per leaf comes to the host.
    """
    named = [
        (jax.tree_util.keystr(path), leaf)
        for path, leaf in jax.tree_util.tree_leaves_with_path(tree)
        if jnp.issubdtype(leaf.dtype, jnp.inexact)
    ]
    if not named:
        return []
    finite = np.asarray(_finite_per_leaf([leaf for _, leaf in named]))
    return [name for (name, _), ok in zip(named, finite, strict=True) if not ok]


def check_state_finite(step: int, state: Any, hint: str) -> None:
    """Raises `NonFiniteLossError` naming `step` and the leaves if `state` holds an inf or NaN.

    Args:
      step: The step `state` belongs to.
      state: Pytree of arrays (e.g. the train state about to be saved).
      hint: What the user can do, appended to the message.
    """
    bad = non_finite_leaves(state)
    if bad:
        listed = ", ".join(bad[:_MAX_LISTED_LEAVES])
        if len(bad) > _MAX_LISTED_LEAVES:
            listed += f" and {len(bad) - _MAX_LISTED_LEAVES} more"
        raise NonFiniteLossError(
            f"Training diverged by step {step}: the state holds inf or NaN in {listed}. {hint}"
        )


class OverflowWatch:
    """Stops an fp16 run whose every step overflows: skipping cannot make progress there.

    fp16 loss scaling skips a step with non-finite gradients and halves the scale, down to
    `minimum`; a run still skipping at the minimum has diverged (or its data holds inf/NaN),
    and would otherwise finish with untrained parameters and exit 0.

    Args:
      minimum: The loss scale's floor (`precision.loss_scale.minimum`).
      limit: Consecutive skipped steps at the floor after which the run stops.
    """

    def __init__(self, *, minimum: float, limit: int) -> None:
        if limit < 1:
            # 0 would stop every run at its first step, whatever the precision.
            raise ValueError(
                f"precision.loss_scale.max_skips_at_minimum={limit} must be >= 1: the fp16 steps "
                "skipped in a row at the minimum loss scale before the run stops as diverged."
            )
        self._minimum, self._limit, self._run = minimum, limit, 0

    def update(self, step: int, metrics: Mapping[str, float]) -> None:
        """Counts `step` if it was skipped at the floor; raises once `limit` are in a row.

        Raises:
          NonFiniteLossError: `limit` consecutive steps up to `step` overflowed at the floor.
        """
        at_floor = metrics.get("loss_scale", math.inf) <= self._minimum
        self._run = self._run + 1 if metrics.get("skipped", 0.0) >= 1 and at_floor else 0
        if self._run >= self._limit:
            raise NonFiniteLossError(
                f"Training diverged by step {step}: its last {self._run} steps all overflowed in "
                f"fp16 at the minimum loss scale ({self._minimum:g}), so none was applied. Try a "
                "lower optimizer.learning_rate, a longer optimizer.warmup_epochs or "
                "precision.compute='bfloat16', and check the data for inf/NaN. Rerunning with the "
                "same --workdir resumes from the last checkpoint."
            )


class LaggedFetch:
    """Holds the device metrics of the last `lag` dispatched steps; fetches step t's to host once
    step t + `lag` is dispatched.

    Args:
      finite_keys: Metrics that must be finite; checked on every fetch (pass ``()`` where the
        step skips non-finite updates itself, as fp16 loss scaling does).
      lag: Steps dispatched after step t before its metrics are fetched: the host then waits for
        step t with `lag` steps queued behind it, so up to ``lag + 1`` are in flight.
    """

    def __init__(self, *, finite_keys: Sequence[str] = ("loss",), lag: int = 1) -> None:
        if lag < 1:
            raise ValueError(f"lag must be >= 1 (got {lag}): 0 would wait for every step.")
        self._finite_keys, self._lag = tuple(finite_keys), lag
        self._held: collections.deque[tuple[int, Mapping[str, jax.Array] | None]] = (
            collections.deque()
        )

    def push(
        self, step: int, metrics: Mapping[str, jax.Array], *, fetch: bool = True
    ) -> HostMetrics | None:
        """Holds `metrics` of the just-dispatched `step`; returns step ``step - lag``'s on host.

        Args:
          step: The step that was just dispatched.
          metrics: Its scalar device metrics (not yet computed, usually).
          fetch: Whether this step's metrics are wanted (e.g. a log step); unwanted ones are
            dropped without a device-to-host transfer.

        Returns:
          ``(step, {name: float})`` of the step held `lag` pushes ago, or None if there is none
          or it was not wanted.

        Raises:
          NonFiniteLossError: A `finite_keys` metric of the fetched step is inf or NaN.
        """
        self._held.append((step, metrics if fetch else None))
        if len(self._held) <= self._lag:
            return None
        held_step, held = self._held.popleft()
        return None if held is None else self._fetch(held_step, held)

    def flush(self) -> list[HostMetrics]:
        """Fetches every held step's wanted metrics, oldest first (at a save or the end)."""
        held, self._held = list(self._held), collections.deque()
        return [self._fetch(step, metrics) for step, metrics in held if metrics is not None]

    def _fetch(self, step: int, metrics: Mapping[str, jax.Array]) -> HostMetrics:
        host = {name: float(np.asarray(value)) for name, value in jax.device_get(metrics).items()}
        check_finite(step, host, self._finite_keys)
        return step, host


@dataclasses.dataclass(frozen=True)
class Throughput:
    """Training speed over the last measured interval."""

    steps_per_sec: float
    images_per_sec: float
    eta_seconds: float
    # Share of the interval's wall time the host spent blocked on the next batch: near 0 when
    # input keeps up, large when input is the slower side (with a step in flight the device may
    # still be busy while the host waits, so it is not the device's idle share).
    input_wait_fraction: float = 0.0
    # Mean ms a batch the input thread waited in each of its stages (`stage_clock`), if it says.
    input_stages_ms: Mapping[str, float] = dataclasses.field(default_factory=dict)
    # Mean ms the host spent in each step's call (arguments, kernel launches) made in the
    # interval, None if it made none: near the step's own time, the host sets the pace.
    launch_ms: float | None = None


def eta_seconds(step: int, total_steps: int, steps_per_sec: float) -> float:
    """Seconds left to reach `total_steps` from `step` at `steps_per_sec` (inf if not moving)."""
    remaining = max(total_steps - step, 0)
    if remaining == 0:
        return 0.0
    return remaining / steps_per_sec if steps_per_sec > 0 else math.inf


def format_duration(seconds: float) -> str:
    """Formats seconds as ``H:MM:SS`` (``Nd H:MM:SS`` past a day; ``?`` if unknown)."""
    if not math.isfinite(seconds):
        return "?"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    clock = f"{hours}:{minutes:02d}:{secs:02d}"
    return f"{days}d {clock}" if days else clock


class ProgressMeter:
    """Measures training throughput, input wait, launch time and ETA between successive log steps.

    Only training time counts: `restart` begins a new interval after what is not training (a
    run's first step, which compiles and follows the restore of a checkpoint; an evaluation; a
    checkpoint save), so that it neither lowers the rate nor lengthens the ETA.

    Args:
      total_steps: The step training ends at.
      global_batch_size: Images per step over all devices.
      start_step: The step timing starts from (the first step of this run).
      clock: Seconds as a float; injectable for tests.
      stages: The input thread's waits per batch (`Input.stages`), taken at each measure.
    """

    def __init__(
        self,
        *,
        total_steps: int,
        global_batch_size: int,
        start_step: int,
        clock: Callable[[], float] = time.monotonic,
        stages: stage_clock.StageClock | None = None,
    ) -> None:
        self._total_steps = total_steps
        self._global_batch_size = global_batch_size
        self._clock, self._stages = clock, stages
        self.restart(start_step)

    def restart(self, step: int) -> None:
        """Starts the next interval at `step` (just completed), now."""
        # Waits and calls before now fall outside any measured interval, as the time does.
        self._start_interval(step, self._clock())
        if self._stages is not None:
            self._stages.take()

    def _start_interval(self, step: int, now: float) -> None:
        self._last_step, self._last_time = step, now
        self._input_wait, self._launch, self._launches = 0.0, 0.0, 0

    def add_input_wait(self, seconds: float) -> None:
        """Counts `seconds` the host spent waiting for the next batch in this interval."""
        self._input_wait += seconds

    def add_launch(self, seconds: float) -> None:
        """Counts `seconds` the host spent in a step's call (dispatch) in this interval."""
        self._launch += seconds
        self._launches += 1

    def measure(self, step: int) -> Throughput | None:
        """Throughput from the previous call (or restart) to `step`, and the ETA; None if no
        step was completed since."""
        if step <= self._last_step:
            return None
        now = self._clock()
        elapsed = now - self._last_time
        steps_per_sec = (step - self._last_step) / elapsed if elapsed > 0 else 0.0
        wait_fraction = self._input_wait / elapsed if elapsed > 0 else 0.0
        # The loop fetches metrics a few steps late: the calls made in an interval are those of
        # later steps, as many as its steps but at the end of training, so mean over the calls.
        launch_ms = 1e3 * self._launch / self._launches if self._launches else None
        self._start_interval(step, now)
        return Throughput(
            steps_per_sec=steps_per_sec,
            images_per_sec=steps_per_sec * self._global_batch_size,
            eta_seconds=eta_seconds(step, self._total_steps, steps_per_sec),
            input_wait_fraction=wait_fraction,
            input_stages_ms=self._stages.take() if self._stages is not None else {},
            launch_ms=launch_ms,
        )


def format_progress(
    step: int, total_steps: int, metrics: Mapping[str, float], throughput: Throughput | None
) -> str:
    """One console line: step/total, each metric, images/s, input wait, the host's ms a step in
    the step's call and ETA (when measured)."""
    width = len(str(total_steps))
    fields = [f"step {step:>{width}d}/{total_steps}"]
    fields += [f"{name} {value:.4g}" for name, value in metrics.items()]
    if throughput is not None:
        fields += [
            f"{throughput.images_per_sec:.1f} img/s",
            f"input wait {round(100 * throughput.input_wait_fraction)}%"
            + _stages_text(throughput.input_stages_ms),
        ]
        if throughput.launch_ms is not None:
            fields.append(f"launch {throughput.launch_ms:.1f} ms a step")
        fields.append(f"ETA {format_duration(throughput.eta_seconds)}")
    return " | ".join(fields)


def _stages_text(stages_ms: Mapping[str, float]) -> str:
    """The progress line's ` (read 3.1, decode 25 ms a batch)`; empty without stages."""
    return f" ({stage_clock.describe(stages_ms)} ms a batch)" if stages_ms else ""


class MetricsWriter:
    """Writes scalars as TensorBoard event files, from one process only.

    Args:
      logdir: Directory for the event files (e.g. the workdir).
      enabled: Whether this process writes; by default only process 0 does.
    """

    def __init__(self, logdir: epath.PathLike, *, enabled: bool | None = None) -> None:
        if enabled is None:
            enabled = jax.process_index() == 0
        self._writer = tensorboardX.SummaryWriter(logdir=str(logdir)) if enabled else None

    def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
        """Writes each ``tag: value`` at `step` and flushes (log steps are rare)."""
        if self._writer is None:
            return
        for tag, value in scalars.items():
            self._writer.add_scalar(tag, float(value), global_step=step)
        self._writer.flush()

    def close(self) -> None:
        """Flushes and closes the event file."""
        if self._writer is not None:
            self._writer.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
