"""Running the trainer from tests: `python -m jia_jax.main` in a subprocess, and the flags of the
finished digits run the evaluation and export tests share.

Kept apart from conftest.py, which sets the test process's XLA flags when imported: a test's
child process that imports a test module (tests/test_train.py's snippets) must keep its own.
"""

import contextlib
import logging
import os
import pathlib
import subprocess
import sys
from collections.abc import Iterator

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


# conftest.py's flag that turns LLVM's optimisation off: compiles are several times faster, but
# the code runs slower, by ~25x for ResNet-50's convolutions (a 2-step run: 50 s a step instead
# of 2 s, for about the same compile time).
UNOPTIMISED = "--xla_backend_optimization_level=0"


def run_main(
    *args: str, timeout: float = 600, optimised: bool = False, devices: int | None = None
) -> subprocess.CompletedProcess:
    """`python -m jia_jax.main ARGS` from the repository root, on the CPU devices set above;
    `optimised` runs it without UNOPTIMISED (for a model whose steps, not compiles, take long);
    `devices` simulates that many CPU devices instead of conftest.py's 8 (the last count wins)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    if optimised:
        env["XLA_FLAGS"] = " ".join(f for f in env["XLA_FLAGS"].split() if f != UNOPTIMISED)
    if devices is not None:
        env["XLA_FLAGS"] += f" --xla_force_host_platform_device_count={devices}"
    return subprocess.run(
        [sys.executable, "-m", "jia_jax.main", *args],
        cwd=pathlib.Path(__file__).resolve().parents[1],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@contextlib.contextmanager
def flags_restored() -> Iterator[None]:
    """Puts back after the block what parsing `jia_jax.main`'s flags in this process changes:
    sys.argv, absl's flags, its logger's level (absl sets it from --verbosity: WARNING, which
    silences later tests' INFO lines) and main's filter on its handler, the environment."""
    from absl import flags  # pylint: disable=import-outside-toplevel
    from absl import logging as absl_logging  # pylint: disable=import-outside-toplevel

    absl_logger, handler = logging.getLogger("absl"), absl_logging.get_absl_handler()
    level, filters, environ = absl_logger.level, list(handler.filters), dict(os.environ)
    argv = sys.argv
    try:
        yield
    finally:
        sys.argv = argv
        flags.FLAGS.unparse_flags()
        absl_logger.setLevel(level)
        handler.filters[:] = filters
        os.environ.clear()
        os.environ.update(environ)


def main_in_process(*args: str) -> None:
    """`jia_jax.main`'s `main` with ARGS parsed, in this process (to stub what it calls), with
    what it changes put back after (`flags_restored`)."""
    from jia_jax import main  # pylint: disable=import-outside-toplevel

    with flags_restored():
        sys.argv = ["main", *args]  # ml_collections finds --config.* overrides there
        main.parse_flags(sys.argv)
        main.main(["main"])
