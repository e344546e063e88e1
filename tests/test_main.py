"""The command line as users run it: configs, overrides, clear errors for bad input."""

import os
import pathlib
import subprocess
import sys

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
