"""Convolutions in XLA's command buffers: the XLA_FLAGS `jia_jax.main` sets for the config."""

import os
import subprocess
import sys

import ml_collections
import pytest

from configs import default
from jia_jax import command_buffers
from jia_jax import main as main_lib

ON = ml_collections.ConfigDict({"command_buffer_convolutions": True})
GPU = {"CUDA_VISIBLE_DEVICES": "0"}


def test_on_with_a_gpu_appends_the_flag_to_the_users_flags():
    assert command_buffers.environment(ON, GPU) == {"XLA_FLAGS": command_buffers.FLAG}
    mine = {**GPU, "XLA_FLAGS": "--xla_dump_to=/tmp/hlo"}
    assert command_buffers.environment(ON, mine) == {
        "XLA_FLAGS": f"--xla_dump_to=/tmp/hlo {command_buffers.FLAG}"
    }


@pytest.mark.parametrize(
    "xla, environ",
    [
        (ml_collections.ConfigDict({"command_buffer_convolutions": False}), GPU),
        (None, GPU),  # a config from before the `xla` block
        (ON, {"CUDA_VISIBLE_DEVICES": ""}),  # no GPU: the option would do nothing
        (ON, {**GPU, "XLA_FLAGS": "--xla_gpu_enable_command_buffer="}),  # the user's own wins
    ],
)
def test_nothing_is_added_unless_asked_with_a_gpu_and_no_choice_of_the_users(xla, environ):
    assert command_buffers.environment(xla, environ) == {}


def test_a_request_left_to_the_users_flags_is_logged(monkeypatch, caplog):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_enable_command_buffer=FUSION")
    config = default.get_config()
    config.xla.command_buffer_convolutions = True
    with caplog.at_level("INFO"):
        main_lib.set_xla_environment(config)
    assert os.environ["XLA_FLAGS"] == "--xla_gpu_enable_command_buffer=FUSION"
    assert "command_buffer_convolutions left alone" in caplog.text


def test_default_config_leaves_xla_flags_alone(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/hlo")
    main_lib.set_xla_environment(default.get_config())  # one process: no network told either
    assert os.environ["XLA_FLAGS"] == "--xla_dump_to=/tmp/hlo"
    config = default.get_config()
    config.xla.command_buffer_convolutions = True
    main_lib.set_xla_environment(config)
    assert os.environ["XLA_FLAGS"] == f"--xla_dump_to=/tmp/hlo {command_buffers.FLAG}"


@pytest.mark.parametrize("flag, parses", [(command_buffers.FLAG, True),
                                          ("--xla_gpu_enable_command_buffer=+NO_SUCH", False)])
def test_this_jax_knows_the_command_type(flag, parses):
    # XLA parses XLA_FLAGS when JAX starts its backend, on CPU too, and exits on a command type it
    # does not know: the flag must name one of the installed XLA's.
    env = {**os.environ, "XLA_FLAGS": flag, "JAX_PLATFORMS": "cpu"}
    code = "import jax.numpy as jnp; print(float(jnp.arange(4.0).sum()))"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)
    assert (done.returncode == 0 and done.stdout.strip() == "6.0") == parses, done.stderr[-500:]
