"""The trainer's step trained in a thread on one device, paused and resumed between measurements,
and its kernels traced while something else runs (scripts/bench/gpu_decode.py `loaded` and
`contention`, scripts/bench/second_stream.py).

On CPU (tests) the trace holds no GPU kernels, so no boundaries.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")


class StepTimes(list):
    """When each step of `training` finished, and in `calls` the seconds each spent in the step's
    call (its launch); `run(flag)` resumes or pauses the training (a pause returns once no step is
    in flight)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[float] = []
        self.running = False
        self.idle = threading.Event()
        self.error: BaseException | None = None  # what ended the training thread, if anything

    def run(self, flag: bool) -> None:
        """Resumes (True) or pauses (False) the training.

        Raises:
          RuntimeError: the training thread failed (its error chained), instead of waiting for
            a pause that never comes.
        """
        if flag:
            self.idle.clear()
        self.running = flag
        if not flag:
            self.idle.wait()
        if self.error is not None:
            raise RuntimeError("the training thread failed") from self.error


@contextlib.contextmanager
def training(device, per_gpu: int, args: argparse.Namespace) -> Iterator[StepTimes]:
    """The trainer's step of `args.train_model` (in `args.train_compute_dtype`; tiny where
    `args.tiny_model`) on `device` at `per_gpu` images, synthetic data, `flat`, in a thread, one
    step in flight ahead, while the yielded times' `running` is set."""
    import jax  # pylint: disable=import-outside-toplevel

    from jia_jax import train  # pylint: disable=import-outside-toplevel
    from scripts.bench import trainer_step  # pylint: disable=import-outside-toplevel

    small = dict(image_size=32, model_width=8, small_inputs=True) if args.tiny_model else {}
    config = trainer_step.make_config(
        args.train_model,
        "flat",
        1,
        1,
        per_device_batch_override=per_gpu,
        compute_dtype=args.train_compute_dtype,
        **small,
    )
    setup = trainer_step.build_setup(config, [device])
    parts = (setup["model"], setup["tx"], setup["schedule"], config, setup["mesh"])
    step, batch = train.make_train_step(*parts), setup["batch"]
    state, _ = jax.block_until_ready(step(setup["init"](), batch))  # compiled before any row
    times, stop = StepTimes(), threading.Event()

    def run(state) -> None:
        try:
            steps_until_stopped(state)
        except BaseException as e:  # pylint: disable=broad-except
            times.error = e  # raised by the next pause, in the thread that pauses
            times.idle.set()

    def steps_until_stopped(state) -> None:
        previous = None
        while not stop.is_set():
            if not times.running:
                jax.block_until_ready(previous)
                times.idle.set()
                time.sleep(0.01)
                continue
            start = time.perf_counter()
            state, metrics = step(state, batch)
            times.calls.append(time.perf_counter() - start)
            jax.block_until_ready(previous)
            previous = metrics
            times.append(time.perf_counter())
        jax.block_until_ready(state)

    thread = threading.Thread(target=run, args=(state,), daemon=True)
    thread.start()
    try:
        yield times
    finally:
        stop.set()
        thread.join()


def traced_kernels(call: Callable[[], T]) -> tuple[T, dict[str, list]]:
    """`call()`'s result and the kernels each device ran while it ran (`jax.profiler`'s trace,
    read by `profile_trace.load_kernels`)."""
    import jax  # pylint: disable=import-outside-toplevel

    from scripts.bench import profile_trace  # pylint: disable=import-outside-toplevel

    with tempfile.TemporaryDirectory() as trace_dir:
        with jax.profiler.trace(trace_dir):
            result = call()
        return result, profile_trace.load_kernels(trace_dir)


def traced_steps(times: StepTimes, call: Callable[[], T]) -> tuple[T, int, dict[str, Any] | None]:
    """`call()`'s result, the steps of `training` finished while it ran, and how the kernels of
    the first GPU's busiest stream followed one another meanwhile (`traced_boundaries` of
    `traced_kernels`); the training runs again after.

    The trace starts and stops with the step paused, none in flight: on an H200 (jax 0.11.2) a
    trace started from another thread while the step's thread launched failed the step at once
    ("CUDA_ERROR_LAUNCH_FAILED: unspecified launch failure").
    """
    def counted() -> tuple[T, int]:
        times.run(True)
        before = len(times)
        result = call()
        steps = len(times) - before
        times.run(False)
        return result, steps

    times.run(False)
    (result, steps), kernels = traced_kernels(counted)
    times.run(True)
    return result, steps, traced_boundaries(kernels, steps)


def traced_boundaries(kernels: dict[str, list], steps: int) -> dict[str, Any] | None:
    """`profile_trace.stream_boundaries` of the first GPU's `kernels` (per device, as
    `profile_trace.load_kernels` gives them) over `steps` steps, or None where there are none."""
    from scripts.bench import profile_trace  # pylint: disable=import-outside-toplevel

    gpus = sorted(d for d in kernels if "GPU" in d)
    if not gpus or steps < 1:
        return None
    return profile_trace.stream_boundaries(kernels[gpus[0]], steps)
