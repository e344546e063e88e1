"""jia_jax/process_per_gpu.py: when `python -m jia_jax.main` trains as one process per GPU, what
each trainer it starts is given, and how it waits for them and passes signals on.

The whole job through `python -m jia_jax.main` on CPU devices is in tests/test_multiprocess.py.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from configs import resnet50_64k
from jia_jax import gpu_decode
from jia_jax import process_per_gpu
from jia_jax import xla_network

REPO_ROOT = Path(__file__).resolve().parents[1]
TWO_GPUS = {"CUDA_VISIBLE_DEVICES": "0,1"}


@pytest.fixture
def gpu_host(monkeypatch):
    """A machine where JAX runs on CUDA and nvImageCodec is installed (both looked up, never
    imported, before JAX starts)."""
    monkeypatch.setattr(process_per_gpu, "_jax_runs_on_cuda", lambda environ: True)
    monkeypatch.setattr(gpu_decode, "library_installed", lambda: True)


def config(**fields):
    """The 64K ResNet-50 config on imagenet2012 with `fields` ("a.b": value) set."""
    cfg = resnet50_64k.get_config()
    cfg.data.name = "imagenet2012"
    for name, value in fields.items():
        block, key = name.rsplit(".", 1)
        target = cfg
        for part in block.split("."):
            target = target[part]
        target[key] = value
    return cfg


def test_auto_splits_a_gpu_decoding_run_on_several_gpus(gpu_host):
    assert process_per_gpu.split_count(config(), "train", TWO_GPUS) == 2
    four = {"CUDA_VISIBLE_DEVICES": "GPU-aa,GPU-bb,GPU-cc,GPU-dd"}
    assert process_per_gpu.split_count(config(), "train", four) == 4


@pytest.mark.parametrize(
    "fields, mode, environ",
    [
        ({"distributed.process_per_gpu": "never"}, "train", TWO_GPUS),
        ({}, "eval", TWO_GPUS),
        ({}, "export", TWO_GPUS),
        ({}, "train", {"CUDA_VISIBLE_DEVICES": "0"}),
        ({}, "train", {**TWO_GPUS, "SLURM_NTASKS": "2"}),  # a task of a launcher's job
        ({"distributed.coordinator_address": "10.0.0.1:1234"}, "train", TWO_GPUS),
        ({"mesh.node": 1, "mesh.gpu": 2}, "train", TWO_GPUS),  # the layout the user chose
        ({"data.decode": "cpu"}, "train", TWO_GPUS),
        ({"data.name": "synthetic"}, "train", TWO_GPUS),  # no JPEGs
        ({}, "train", {**TWO_GPUS, "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.99"}),  # decodes on CPU
    ],
)
def test_auto_trains_in_this_process(gpu_host, fields, mode, environ):
    assert process_per_gpu.split_count(config(**fields), mode, environ) == 1


def test_auto_needs_nvimgcodec_and_jax_on_cuda(monkeypatch):
    monkeypatch.setattr(process_per_gpu, "_jax_runs_on_cuda", lambda environ: True)
    monkeypatch.setattr(gpu_decode, "library_installed", lambda: False)
    assert process_per_gpu.split_count(config(), "train", TWO_GPUS) == 1
    monkeypatch.undo()
    monkeypatch.setattr(gpu_decode, "library_installed", lambda: True)
    on_cpu = {**TWO_GPUS, "JAX_PLATFORMS": "cpu"}
    assert process_per_gpu.split_count(config(), "train", on_cpu) == 1


def test_always_splits_whatever_the_data(gpu_host):
    synthetic = config(**{"data.name": "synthetic", "distributed.process_per_gpu": "always"})
    assert process_per_gpu.split_count(synthetic, "train", TWO_GPUS) == 2
    assert process_per_gpu.split_count(synthetic, "train", {"CUDA_VISIBLE_DEVICES": "0"}) == 1


def test_a_bad_choice_is_one_line_naming_the_field():
    with pytest.raises(ValueError, match=r"distributed.process_per_gpu='yes' is not one of"):
        process_per_gpu.split_count(
            config(**{"distributed.process_per_gpu": "yes"}), "train", TWO_GPUS
        )


def test_each_trainer_gets_one_gpu_its_process_id_and_a_share_of_the_workers():
    argv = ["jia_jax/main.py", "--config=configs/resnet50_64k.py", "--workdir=/w",
            "--config.data.num_workers=17"]
    environ = {"CUDA_VISIBLE_DEVICES": "GPU-aa, GPU-bb", "KEEP": "me"}
    commands = process_per_gpu.trainer_commands(argv, 2, 17, 4321, environ, "/errors")
    for i, (command, env) in enumerate(commands):
        assert command[:3] == [sys.executable, "-m", "jia_jax.main"]
        assert command[3:6] == argv[1:]  # the user's flags, then the launcher's, which win
        assert command[6:] == [
            "--config.distributed.coordinator_address=127.0.0.1:4321",
            "--config.distributed.num_processes=2",
            "--config.data.num_workers=8",
            f"--config.distributed.process_id={i}",
            *([] if i == 0 else ["--verbosity=-1"]),  # the first's progress alone is logged
        ]
        assert env["CUDA_VISIBLE_DEVICES"] == ["GPU-aa", "GPU-bb"][i] and env["KEEP"] == "me"
        assert env[process_per_gpu.ERROR_FILE] == f"/errors/trainer_{i}"  # one file each
        # one host: the trainers pack after backward and plan over NVLink (jia_jax/xla_network.py)
        assert xla_network.one_host(2, env)


@pytest.mark.parametrize("workers, each", [(0, 0), (1, 1), (3, 1), (16, 8)])
def test_workers_are_shared_and_never_dropped_to_none(workers, each):
    [(command, _), _] = process_per_gpu.trainer_commands(["main"], 2, workers, 1, TWO_GPUS, "/")
    assert f"--config.data.num_workers={each}" in command


def test_each_distinct_error_is_reported_once_naming_processes_where_not_all_had_it(tmp_path):
    for i, text in enumerate(["ValueError: bad", "ValueError: bad", "OSError: disk", None]):
        if text is not None:
            (tmp_path / f"trainer_{i}").write_text(text)
    assert process_per_gpu.reported_errors(str(tmp_path), 4) == [
        "process 0, 1 of 4: ValueError: bad", "process 2 of 4: OSError: disk"]
    (tmp_path / "trainer_3").write_text("ValueError: bad")
    (tmp_path / "trainer_2").unlink()
    three = process_per_gpu.reported_errors(str(tmp_path), 3)
    assert three == ["process 0, 1 of 3: ValueError: bad"]
    assert process_per_gpu.reported_errors(str(tmp_path), 2) == ["ValueError: bad"]  # all of them


def _trainers(tmp_path: Path, codes: list[str]) -> list[tuple[list[str], dict[str, str]]]:
    """Stand-in trainers: each writes `ready_i` (whether it leads its own process group),
    records every SIGTERM / SIGINT it gets in `signals_i` and then exits 0, or otherwise runs
    `codes[i]` (Python) after a moment."""
    body = """
import os, signal, sys, time
i, out = sys.argv[1], sys.argv[2]
def record(signum, frame):
    with open(os.path.join(out, "signals_" + i), "a") as f:
        f.write(signal.Signals(signum).name + "\\n")
    time.sleep(0.5)  # a second delivery seen apart would be recorded meanwhile
    sys.exit(0)
signal.signal(signal.SIGTERM, record)
signal.signal(signal.SIGINT, record)
with open(os.path.join(out, "ready_" + i), "w") as f:
    f.write(str(os.getpgrp() == os.getpid()))  # whether it leads a process group of its own
time.sleep(0.2)
exec(sys.argv[3])
"""
    return [([sys.executable, "-c", body, str(i), str(tmp_path), code], dict(os.environ))
            for i, code in enumerate(codes)]


def _launch(tmp_path: Path, codes: list[str], **popen) -> subprocess.Popen:
    """`run_trainers` of `_trainers(tmp_path, codes)` in a process of its own, whose exit status
    is what it returns (as jia_jax.main's is): a fresh interpreter, not this one, whose JAX
    threads make a fork unsafe."""
    trainers = pickle.dumps(_trainers(tmp_path, codes))
    launcher = f"""
import pickle, sys
from jia_jax import process_per_gpu
sys.exit(process_per_gpu.run_trainers(pickle.loads({trainers!r})))
"""
    return subprocess.Popen([sys.executable, "-c", launcher], cwd=REPO_ROOT, **popen)


def _wait_ready(tmp_path: Path, job: subprocess.Popen, deadline: float) -> None:
    """Until both stand-in trainers have written `ready_i`."""
    while not all((tmp_path / f"ready_{i}").exists() for i in range(2)):
        assert time.monotonic() < deadline and job.poll() is None
        time.sleep(0.05)


def test_the_first_failing_status_is_the_jobs(tmp_path):
    codes = ["sys.exit(0)", "sys.exit(3)", "sys.exit(5)"]
    assert _launch(tmp_path, codes).wait(timeout=60) == 3
    assert _launch(tmp_path, ["sys.exit(0)"] * 2).wait(timeout=60) == 0
    killed = ["sys.exit(0)", "os.kill(os.getpid(), signal.SIGKILL)"]
    assert _launch(tmp_path, killed).wait(timeout=60) == 128 + signal.SIGKILL


@pytest.mark.parametrize("send", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_reaches_each_trainer_once(tmp_path, send):
    """Sent to the launching process's whole process group, as Ctrl-C in a terminal sends it:
    each trainer gets it once, from the launcher, and the job exits 0."""
    job = _launch(tmp_path, ["time.sleep(60)"] * 2, start_new_session=True)
    _wait_ready(tmp_path, job, time.monotonic() + 60)
    # Outside the launcher's group, which the terminal signals: a second delivery, which a
    # trainer's handler may not see apart from the first, would stop it before it saves.
    assert [(tmp_path / f"ready_{i}").read_text() for i in range(2)] == ["True"] * 2
    os.killpg(job.pid, send)
    assert job.wait(timeout=60) == 0
    for i in range(2):
        assert (tmp_path / f"signals_{i}").read_text() == f"{send.name}\n"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl's parent-death signal")
def test_a_launcher_killed_outright_stops_its_trainers_with_sigterm(tmp_path):
    """SIGKILL to the launcher, which it cannot pass on: each trainer still gets one SIGTERM
    (and so saves and exits) instead of training on without it."""
    deadline = time.monotonic() + 60
    job = _launch(tmp_path, ["time.sleep(60)"] * 2)
    _wait_ready(tmp_path, job, deadline)
    job.kill()
    job.wait(timeout=60)
    while not all((tmp_path / f"signals_{i}").exists() for i in range(2)):
        assert time.monotonic() < deadline, "a trainer outlived its launcher without a signal"
        time.sleep(0.05)
    time.sleep(0.6)  # the handler's own wait: a second signal would be recorded by now
    for i in range(2):
        assert (tmp_path / f"signals_{i}").read_text() == "SIGTERM\n"
