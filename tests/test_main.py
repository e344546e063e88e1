"""The command line as users run it: configs, overrides, clear errors for bad input."""

import os
import pathlib
import re
import subprocess
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from configs import digits
from jia_jax import loop

REPO = pathlib.Path(__file__).resolve().parents[1]


def run_main(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, JAX_PLATFORMS="cpu")  # XLA_FLAGS from conftest: 8 devices
    return subprocess.run(
        [sys.executable, "-m", "jia_jax.main", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_resnet50_64k_config_runs_on_cpu_with_small_overrides(tmp_path):
    """The paper's ResNet-50 config, as is, with only sizes shrunk: 2 steps on a 2x4 CPU mesh."""
    result = run_main(
        "--config=configs/resnet50_64k.py",
        f"--workdir={tmp_path}",
        "--config.data.name=synthetic",
        "--config.data.image_size=32",
        "--config.global_batch_size=32",
        "--config.microbatch_size=2",
        "--config.total_steps=2",
        "--config.optimizer.warmup_epochs=0",
        "--config.mesh.node=2",
        "--config.mesh.gpu=4",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "step 2/2" in result.stderr
    assert "{'node': 2, 'gpu': 4}" in result.stderr
    assert (tmp_path / "checkpoints" / "2").is_dir()
    assert list(tmp_path.glob("events.out.tfevents.*"))


@pytest.mark.parametrize(
    "field, value",
    [
        ("model.name", "resnet51"),
        ("global_batch_size", 60),
        ("mesh.node", 3),
        ("comm.strategy", "ring"),
        ("precision.compute", "float8"),
        ("optimizer.name", "adam"),
        ("optimizer.decay", "step"),
    ],
)
def test_bad_config_fails_naming_the_field(tmp_path, field, value):
    config = digits.get_config()
    parent, _, leaf = field.rpartition(".")
    setattr(config[parent] if parent else config, leaf, value)
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        loop.train_and_evaluate(config, str(tmp_path))
    assert not (tmp_path / "checkpoints").exists()


def test_bf16_divergence_stops_naming_the_step_and_keeps_the_last_finite_checkpoint(tmp_path):
    result = run_main(
        "--config=configs/digits.py",
        f"--workdir={tmp_path}",
        "--config.precision.compute=bfloat16",
        "--config.model.width=4",
        "--config.data.image_size=8",
        "--config.total_steps=4",
        "--config.checkpoint_every_steps=1",
        "--config.checkpoint_keep=10",
        "--config.log_every_steps=1",
        "--config.optimizer.base_learning_rate=1e8",
        "--config.optimizer.warmup_epochs=0",
    )
    assert result.returncode != 0, result.stderr[-3000:]
    match = re.search(r"NonFiniteLossError: Training diverged (at|by) step (\d+)", result.stderr)
    assert match, result.stderr[-3000:]
    diverged = int(match.group(2))
    assert diverged <= 4 and "final eval" not in result.stderr
    directory = tmp_path / "checkpoints"
    saved = sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())
    # A checkpoint every step: the newest is the step before the one named, and it is finite.
    assert saved and saved[-1] == diverged - 1, (saved, match.group(0))
    with ocp.StandardCheckpointer() as reader:
        state = reader.restore(directory / str(saved[-1]) / "state")
    leaves = jax.tree.leaves(state)
    assert leaves and all(np.isfinite(np.asarray(leaf)).all() for leaf in leaves)
