"""One training process per GPU, started by `python -m jia_jax.main` itself.

One process decoding JPEGs for several GPUs does not keep up: on two H200s it trained 0.745 of
the synthetic-data speed where one process per GPU trained 0.971, and two processes of one host
train the synthetic step as fast as one (docs/input_pipeline.md, docs/benchmarks.md). So where a
single training process on a machine of several GPUs would decode on them
(`distributed.process_per_gpu="auto"`), or always (`"always"`), main becomes a launcher: it
starts one trainer per visible GPU, joined by `jax.distributed` over 127.0.0.1 as
`scripts/launch_local.sh N 1` joins them, forwards SIGINT and SIGTERM to each once (each saves a
checkpoint and exits 0), and exits with the first failing status. `"never"` trains in one process.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import pkgutil
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence

import ml_collections

from jia_jax import gpu_decode
from jia_jax import input_pipeline
from jia_jax import mesh
from jia_jax import xla_network

CHOICES = ("auto", "always", "never")
# The file a trainer started here writes its one-line error to (a user's mistake, which every
# trainer hits alike), for the launcher to print each distinct one once instead of N times.
ERROR_FILE = "JIA_JAX_ERROR_FILE"
# absl's flag for a trainer after the first: warnings and errors only.
_QUIET = ("--verbosity=-1",)
# prctl(2)'s option: the signal a process gets when its parent ends.
_PR_SET_PDEATHSIG = 1


def _jax_runs_on_cuda(environ: Mapping[str, str]) -> bool:
    """Whether JAX would start on CUDA GPUs: a CUDA plugin installed and JAX_PLATFORMS, where
    set, naming CUDA (checked without starting JAX)."""
    platforms = environ.get("JAX_PLATFORMS", "")
    if platforms and not any(p in platforms for p in ("cuda", "gpu")):
        return False
    if importlib.util.find_spec("jax_plugins") is None:
        return False
    import jax_plugins  # pylint: disable=import-outside-toplevel

    return any(m.name.startswith("xla_cuda") for m in pkgutil.iter_modules(jax_plugins.__path__))


def _would_decode_on_gpu(data: ml_collections.ConfigDict, environ: Mapping[str, str]) -> bool:
    """Whether `data.decode` would take the GPU path here (as `input_pipeline.resolve_decode`
    decides, from what is known before JAX starts)."""
    if data.name in input_pipeline.NO_JPEGS or data.decode == "cpu":
        return False
    if not gpu_decode.library_installed():
        return False
    try:
        gpu_decode.check_memory_fraction(environ)
    except ValueError:
        return False
    return True


def split_count(config: ml_collections.ConfigDict, mode: str, environ: Mapping[str, str]) -> int:
    """The trainers `python -m jia_jax.main --mode=mode` starts for `config` here: one per visible
    GPU (`xla_network.visible_gpus`) where this is a single process training on a machine of
    several and the mesh is left to infer, if `distributed.process_per_gpu` is "always", or
    "auto" and JAX runs on CUDA and the data's JPEGs would be decoded on the GPUs; else 1 (train
    in this process).

    Raises:
      ValueError: `distributed.process_per_gpu` is not one of `CHOICES`.
    """
    choice = config.distributed.get("process_per_gpu", "never")
    if choice not in CHOICES:
        raise ValueError(
            f"distributed.process_per_gpu={choice!r} is not one of {CHOICES}: 'auto' starts one "
            "training process per GPU where one would decode JPEGs on several GPUs."
        )
    gpus = xla_network.visible_gpus(environ)
    if (
        choice == "never"
        or mode != "train"
        or len(gpus) < 2
        or config.distributed.coordinator_address  # one of a job a launcher started
        or mesh.process_count(config.distributed, environ) > 1  # a SLURM / MPI task
        or (config.mesh.node, config.mesh.gpu) != (-1, -1)  # the user chose the layout
    ):
        return 1
    if choice == "auto" and not (
        _jax_runs_on_cuda(environ) and _would_decode_on_gpu(config.data, environ)
    ):
        return 1
    return len(gpus)


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now, for the coordinator."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def trainer_commands(
    argv: Sequence[str],
    count: int,
    num_workers: int,
    port: int,
    environ: Mapping[str, str],
    errors: str,
) -> list[tuple[list[str], dict[str, str]]]:
    """The command line and environment of each of `count` trainers that replace the process
    started with `argv` (sys.argv): trainer i sees the i-th visible GPU and is process i of the
    job, and `num_workers` (`data.num_workers`, sized for the machine) is shared among them.
    Trainers after the first log warnings and errors only: their progress lines would repeat
    the first's (each logs the job's global rate). Each leaves its one-line error, if it ends
    with one, in the folder `errors` (`reported_errors`)."""
    gpus = xla_network.visible_gpus(environ)
    shared = [
        f"--config.distributed.coordinator_address=127.0.0.1:{port}",
        f"--config.distributed.num_processes={count}",
        f"--config.data.num_workers={max(1, num_workers // count) if num_workers else 0}",
    ]
    return [
        (
            [sys.executable, "-m", "jia_jax.main", *argv[1:], *shared,
             f"--config.distributed.process_id={i}", *([] if i == 0 else _QUIET)],
            {**environ, "CUDA_VISIBLE_DEVICES": gpus[i],
             xla_network.LOCAL_PROCESSES: str(count),
             ERROR_FILE: os.path.join(errors, f"trainer_{i}")},
        )
        for i in range(count)
    ]


def reported_errors(errors: str, count: int) -> list[str]:
    """Each distinct one-line error the `count` trainers left in the folder `errors`, once, in
    the trainers' order; one that not all of them left names the processes that did."""
    left: dict[str, list[int]] = {}
    for i in range(count):
        path = os.path.join(errors, f"trainer_{i}")
        if os.path.exists(path):
            with open(path) as f:
                left.setdefault(f.read(), []).append(i)
    return [
        text if len(ids) == count else f"process {', '.join(map(str, ids))} of {count}: {text}"
        for text, ids in left.items()
    ]


def _stop_with(parent: int) -> Callable[[], None] | None:
    """What a trainer runs before its program (Linux; elsewhere nothing): SIGTERM to it when
    the launching process `parent` ends, however it ends, so that a launcher killed outright
    leaves no trainer running on; the SIGTERM makes each save a checkpoint and exit."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork, not in the child

    def stop_with_parent() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # it ended before the line above took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return stop_with_parent


def run_trainers(commands: Sequence[tuple[list[str], dict[str, str]]]) -> int:
    """Runs `commands` (`trainer_commands`) to their end; returns the first failing exit status
    (128 + N for a trainer killed by signal N), else 0.

    SIGINT and SIGTERM to this process reach each trainer once. The trainers run in sessions of
    their own, so Ctrl-C in a terminal, which signals the terminal's whole process group, is
    not delivered to them a second time (that would stop them before they save). If this
    process ends first, however it ends, each trainer gets SIGTERM (`_stop_with`).
    """
    trainers: list[subprocess.Popen] = []

    def forward(signum, frame):  # pylint: disable=unused-argument
        for trainer in trainers:
            if trainer.poll() is None:
                trainer.send_signal(signum)

    # Forwarding from before the first start: a signal meanwhile reaches those started.
    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for command, env in commands:
            trainers.append(subprocess.Popen(
                command, env=env, start_new_session=True, preexec_fn=_stop_with(os.getpid())
            ))
        codes = [trainer.wait() for trainer in trainers]
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    failed = [128 - c if c < 0 else c for c in codes if c != 0]
    return failed[0] if failed else 0
