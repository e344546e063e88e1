"""The train step with its convolutions in XLA's command buffers (CUDA graphs), primed.

At 64 images per GPU the host's part of a ResNet-50 step (handing ~1,400 kernels to the GPU)
takes nearly as long as the step (docs/input_pipeline.md, "At 64 images per GPU the host sets
the pace"). XLA records most kernels into command buffers, launched as one graph each, but not
cuDNN's convolutions, which split the step into many short graphs, unless told (`CONVOLUTION`
among `xla_gpu_enable_command_buffer`'s kinds).

Told, XLA records each graph on the executable's first run, capturing every convolution's cuDNN
call. That capture failed (`unknown cudnn status: 5003`) whenever the process had not run those
convolutions before: where their algorithms came from XLA's autotuning cache instead of from
autotuning them in the process (JAX's compilation cache skips autotuning alike). Measured on one
H200, the same step primed by one run of the executable compiled without convolutions in graphs
trained, and unprimed failed (docs/benchmarks.md, "Convolutions in command buffers, primed").
So `GraphStep` runs the first step compiled without them, which runs every convolution, and
every later step compiled with them. The two executables compute the same function: only how
their kernels are launched differs.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import jax
from absl import logging

from jia_jax import console

MODES = ("auto", "always", "never")
OPTION = "xla_gpu_enable_command_buffer"
# XLA's default kinds of command-buffer work (xla/debug_options_flags.cc) and convolutions. A
# compiler option replaces the flag's list (no `+KIND` form), so it names them all.
WITH_CONVOLUTIONS = "FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,DYNAMIC_SLICE_FUSION,CONVOLUTION"


def wanted(mode: str, platform: str, xla_flags: str) -> bool:
    """Whether the train step runs its convolutions in command buffers.

    Args:
      mode: `launch.convolution_graphs`: "always" or "never", or "auto": on GPUs unless
        `xla_flags` sets the command-buffer kinds itself (the user's choice stands).
      platform: JAX's backend ("gpu", "cpu", ...); command buffers exist on GPUs only.
      xla_flags: The process's XLA_FLAGS.

    Raises:
      ValueError: `mode` is not one of `MODES`.
    """
    if mode not in MODES:
        raise ValueError(f"launch.convolution_graphs={mode!r} is not one of {MODES}.")
    if mode == "never" or platform != "gpu":
        return False
    return mode == "always" or f"--{OPTION}" not in xla_flags


def compile_primed(
    lowered: jax.stages.Lowered, *args: Any, options: dict[str, Any] | None = None
) -> tuple[jax.stages.Compiled, Any]:
    """`lowered` compiled with convolutions in command buffers, after one run on `args` of it
    compiled without them (which runs every convolution once in this process).

    Args:
      lowered: the step, lowered for `args`.
      *args: its arguments for the priming run.
      options: other compiler options, given to both compiles (e.g. a benchmark variant's).

    Returns:
      The compiled step with graphs, and the outputs of that first run (its donated inputs are
      gone: continue from these).
    """
    graphs = lowered.compile({**(options or {}), OPTION: WITH_CONVOLUTIONS})
    return graphs, lowered.compile(options)(*args)


def compile_like_training(
    lowered: jax.stages.Lowered,
    mode: str,
    state: Any,
    *rest: Any,
    options: dict[str, Any] | None = None,
) -> tuple[jax.stages.Compiled, Any, bool]:
    """`lowered`, a train step lowered for `(state, *rest)`, compiled as the trainer runs it
    (for benchmarks that compile the step themselves): primed, with convolutions in graphs,
    where `wanted` under `mode` and this process's XLA_FLAGS, else plainly; with `options`,
    other compiler options, either way. Options that set the command-buffer kinds themselves
    are the caller's choice, as the flag's are: compiled with them alone.

    Returns:
      The compiled step, the state to continue from (the priming step's, if one ran), and
      whether the convolutions run in graphs.
    """
    own = OPTION in (options or {})
    if own or not wanted(mode, jax.default_backend(), os.environ.get("XLA_FLAGS", "")):
        return lowered.compile(options), state, False
    compiled, (state, _) = compile_primed(lowered, state, *rest, options=options)
    return compiled, state, True


class GraphStep:
    """A jitted train step whose calls after the first run with convolutions in graphs.

    The first call lowers `step` for its arguments and compiles it twice (`compile_primed`): the
    run without graphs is that call's result. Later calls must pass arguments of the same
    shapes and tree as the first: the trainer's steps do.
    """

    def __init__(self, step: jax.stages.Wrapped) -> None:
        self._step = step
        self._graphs: Callable[..., Any] | None = None

    def __call__(self, *args: Any) -> Any:
        if self._graphs is None:
            self._graphs, outputs = compile_primed(self._step.lower(*args), *args)
            return outputs
        return self._graphs(*args)


def for_training(step: jax.stages.Wrapped, mode: str, xla_flags: str) -> Callable[..., Any]:
    """`step` as the trainer runs it: a `GraphStep` where `wanted`, else `step` itself."""
    if not wanted(mode, jax.default_backend(), xla_flags):
        return step
    logging.info("train step: convolutions in XLA's command buffers (launch.convolution_graphs)")
    return GraphStep(step)


def error_text(error: BaseException, mode: str, platform: str, xla_flags: str) -> str | None:
    """One line for a cuDNN failure in a run whose train step launched its convolutions in
    graphs (`wanted`), naming the setting that launches them one by one; None otherwise."""
    cudnn = isinstance(error, jax.errors.JaxRuntimeError) and "cudnn" in str(error).lower()
    if not (cudnn and mode in MODES and wanted(mode, platform, xla_flags)):
        return None
    return (
        f"cuDNN failed in the train step ({console.one_line(str(error), 160)}), whose "
        "convolutions run in XLA's command buffers (launch.convolution_graphs="
        f"{mode!r}): rerun with --config.launch.convolution_graphs=never, the same training "
        "with its kernels launched one by one; --traceback shows where it failed."
    )
