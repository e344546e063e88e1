"""Test setup: 8 simulated CPU devices, so SPMD code runs on a 2x4 mesh without GPUs, and a
finished digits run that the evaluation and export tests read."""

import os
import pathlib

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


from tests.main_util import DIGITS_RUN_FLAGS, run_main  # noqa: E402  after the flags


@pytest.fixture(scope="session")
def digits_run(tmp_path_factory) -> tuple[pathlib.Path, str]:
    """(workdir, log) of a finished `python -m jia_jax.main` digits run with DIGITS_RUN_FLAGS."""
    workdir = tmp_path_factory.mktemp("digits_run")
    result = run_main(*DIGITS_RUN_FLAGS, f"--workdir={workdir}")
    assert result.returncode == 0, result.stderr[-3000:]
    return workdir, result.stderr
