"""Test setup: 8 simulated CPU devices, so SPMD code runs on a 2x4 mesh without GPUs, and a
finished digits run that the evaluation and export tests read."""

import os
import pathlib
import subprocess
import sys

import pytest

# Must happen before jax is imported anywhere in the test process; subprocesses inherit it.
# Without LLVM's optimisation passes the CPU programs compile several times faster, which is most
# of the suite's time on a 2-core machine; the arithmetic is the same IEEE fp32.
os.environ["XLA_FLAGS"] = " ".join(
    [
        os.environ.get("XLA_FLAGS", ""),
        "--xla_force_host_platform_device_count=8",
        "--xla_backend_optimization_level=0",
        "--xla_llvm_disable_expensive_passes=true",
    ]
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")


# A finished digits run (a tiny ResNet-18 on 8x8 digits, 2x4 mesh): what --mode=eval and
# --mode=export read. Checkpoints and evaluations at steps 15 and 30.
DIGITS_RUN_FLAGS = (
    "--config=configs/digits.py",
    "--config.model.width=4",
    "--config.data.image_size=8",
    "--config.total_steps=30",
    "--config.optimizer.warmup_epochs=0.2",
    "--config.eval_every_steps=15",
    "--config.checkpoint_every_steps=15",
    "--config.log_every_steps=15",
)


def run_main(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """`python -m jia_jax.main ARGS` from the repository root, on the CPU devices set above."""
    return subprocess.run(
        [sys.executable, "-m", "jia_jax.main", *args],
        cwd=pathlib.Path(__file__).resolve().parents[1],
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="session")
def digits_run(tmp_path_factory) -> tuple[pathlib.Path, str]:
    """(workdir, log) of a finished `python -m jia_jax.main` digits run with DIGITS_RUN_FLAGS."""
    workdir = tmp_path_factory.mktemp("digits_run")
    result = run_main(*DIGITS_RUN_FLAGS, f"--workdir={workdir}")
    assert result.returncode == 0, result.stderr[-3000:]
    return workdir, result.stderr
