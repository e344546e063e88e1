"""Test setup: 8 simulated CPU devices, so SPMD code runs on a 2x4 mesh without GPUs, and a
finished digits run that the evaluation and export tests read."""

import gc
import os
import pathlib
import shutil
import tempfile

import pytest

# Must happen before jax is imported anywhere in the test process; subprocesses inherit it.
# Without LLVM's optimisation passes the CPU programs compile several times faster, which is most
# of the suite's time on a 2-core machine; the arithmetic is the same IEEE fp32. XLA's older loop
# emitters compile the trainer's fp32 step in about half the time of its fusion emitters (4.2 ->
# 1.9 s here; ResNet-50's bf16 step ~40% less, though it then runs ~25% slower), with the same
# parameters to the bit after 4 steps of the tiny ResNet-18.
os.environ["XLA_FLAGS"] = " ".join(
    [
        os.environ.get("XLA_FLAGS", ""),
        "--xla_force_host_platform_device_count=8",
        "--xla_backend_optimization_level=0",
        "--xla_llvm_disable_expensive_passes=true",
        "--xla_cpu_use_fusion_emitters=false",
    ]
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One persistent compilation cache for the whole run, its xdist workers and the trainers they
# start: many tests compile the same tiny programs (the same model, mesh and step under different
# checks), which then compile once. A cached executable is the compiled one, so nothing a test
# computes changes. Tests that need a cache of their own (resume, multi-process) set theirs.
_RUN = os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"pid{os.getpid()}"
CACHE_DIR = pathlib.Path(tempfile.gettempdir()) / f"jia_jax_test_xla_cache_{_RUN}"
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(CACHE_DIR))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")


from tests.main_util import DIGITS_RUN_FLAGS, run_main  # noqa: E402  after the flags


@pytest.fixture(scope="session")
def digits_run(tmp_path_factory) -> tuple[pathlib.Path, str]:
    """(workdir, log) of a finished `python -m jia_jax.main` digits run with DIGITS_RUN_FLAGS."""
    workdir = tmp_path_factory.mktemp("digits_run")
    result = run_main(*DIGITS_RUN_FLAGS, f"--workdir={workdir}")
    assert result.returncode == 0, result.stderr[-3000:]
    return workdir, result.stderr


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem) -> None:
    """Freezes what outlives each test, after its fixtures' teardown. Python's full collections
    walked every object of a worker, which grows with each test's traces and compiled programs
    (0.56 s a pass, 69 s of the two workers' CPU in a suite run on a 2-core machine); frozen ones
    are never walked again (three test files in one process: 5% less CPU time, the same peak
    memory). Garbage is collected first, so only live objects are frozen."""
    gc.collect()
    gc.freeze()


def pytest_sessionfinish(session) -> None:
    """The run's compilation cache goes with the run (the controller ends after its workers)."""
    if not hasattr(session.config, "workerinput"):
        shutil.rmtree(CACHE_DIR, ignore_errors=True)
