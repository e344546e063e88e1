"""Convolutions in XLA's command buffers (CUDA graphs), a process-wide XLA option.

XLA records runs of a step's kernels into CUDA graphs and launches each run as one graph
(`--xla_gpu_enable_command_buffer`): by default fusions, cuBLAS and cuDNN calls and custom calls,
not convolutions. Adding them ("+CONVOLUTION", a command type since jax 0.10's XLA) leaves fewer,
longer graphs between convolutions. A step of many short kernels gains most (ResNet-50 at 64
images per GPU on an H200: 789 of 1,371 kernels a step run under 3 us). The step computes the
same: only how its kernels are launched changes. Measured in docs/benchmarks.md, "The same on
one H200".

XLA reads the option from XLA_FLAGS once, when JAX starts its backend, so `jia_jax.main` adds it
to the environment before then (`environment`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jia_jax import xla_network

OPTION = "--xla_gpu_enable_command_buffer"
FLAG = f"{OPTION}=+CONVOLUTION"


def environment(xla: Any, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables to add to `environ` before JAX starts: XLA_FLAGS with `FLAG` appended, where
    `xla.command_buffer_convolutions` (the config's `xla` block) asks for it, the process sees a
    GPU, and the user's XLA_FLAGS do not choose the command buffers' kinds already (theirs win)."""
    if xla is None or not xla.get("command_buffer_convolutions", False):
        return {}
    flags = environ.get("XLA_FLAGS", "")
    if OPTION in flags or xla_network.visible_gpus(environ) < 1:
        return {}
    return {"XLA_FLAGS": f"{flags} {FLAG}".strip()}
