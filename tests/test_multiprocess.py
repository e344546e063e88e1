"""The trainer's own multi-process path, end to end: 2 processes x 2 CPU devices, joined by
`jax.distributed` from the config's `distributed.*` fields (gloo collectives).

Runs go through `scripts/launch_local.sh` or `python -m jia_jax.main` in subprocesses, never
through a helper that starts `jax.distributed` itself. A tiny ResNet-18 (width 4) on 8x8 digits,
12 steps; every run uses the environment launch_local.sh sets, so that runs started either way
compile the same programs (and share a persistent compilation cache). Only process 0 gains from
it: JAX keys a multi-process program by the process's view of the topology too, and writes
from process 0 alone, so process 1 compiles in every run (the cache holds no entry of its).

Two devices per process, not four: each process still drives several devices, and every step's
collectives join 4 gloo ranks, not 8 (a step took ~1 s with 8, ~0.5 s with 4; a run ~47 s, ~30).
"""

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from configs import digits
from jia_jax import input_pipeline, liveness, peer_watch, process_per_gpu
from tests import mp_util
from tests.main_util import run_main
from tests.test_metrics import read_scalars
from tests.test_resume import assert_bitwise_equal

REPO_ROOT = Path(__file__).resolve().parents[1]
PROCESSES, DEVICES = 2, 2
TOTAL_STEPS = 12
CHECKPOINT_EVERY = 4
# The watch runs in a thread of the training process: a main thread tracing the step on a
# loaded 2-core machine has kept it from running for 5 s. 20 s leaves a margin of four.
HEARTBEAT_TIMEOUT_S = 20
# JAX's own default is 100 s: a survivor that is not gone by timeout + this is not using ours.
EXIT_SLACK_S = 45
OVERRIDES = {
    "model.width": 4,
    "data.image_size": 8,
    "total_steps": TOTAL_STEPS,
    "checkpoint_every_steps": CHECKPOINT_EVERY,
    "checkpoint_keep": 10,
    "log_every_steps": 1,
    # Warmup 2 steps, then a learning rate of 0.4: well above chance within 12 steps.
    "optimizer.warmup_epochs": 0.1,
    "optimizer.base_learning_rate": 1.6,
    "distributed.heartbeat_timeout_s": HEARTBEAT_TIMEOUT_S,
}
FLAGS = [f"--config.{name}={value}" for name, value in OVERRIDES.items()]
# Generous: the first run compiles, and the CI box may be busy.
RUN_TIMEOUT_S = 600
STOP_TIMEOUT_S = 180


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    cache = tmp_path_factory.mktemp("xla_cache")
    return {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
        "JAX_COMPILATION_CACHE_DIR": str(cache),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1",
    }


def launch_local(env, workdir, *flags):
    """`scripts/launch_local.sh 2 2 configs/digits.py workdir FLAGS flags`; returns both
    processes' log."""
    command = ["scripts/launch_local.sh", str(PROCESSES), str(DEVICES), "configs/digits.py"]
    result = subprocess.run(
        [*command, str(workdir), *FLAGS, *flags],
        check=False,
        cwd=REPO_ROOT,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=RUN_TIMEOUT_S,
    )
    assert result.returncode == 0, result.stdout
    return result.stdout


def start_process(env, workdir, process_id, address, logs):
    """One process of the job, as launch_local.sh starts it; its stderr goes to a file."""
    # launch_local.sh appends the device count to conftest.py's fast-compile flags (the last
    # count wins) and picks gloo.
    env = {
        **env,
        "XLA_FLAGS": f"{env['XLA_FLAGS']} --xla_force_host_platform_device_count={DEVICES}",
        "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo",
    }
    command = [
        sys.executable,
        "-m",
        "jia_jax.main",
        "--config=configs/digits.py",
        f"--workdir={workdir}",
        f"--config.distributed.coordinator_address={address}",
        f"--config.distributed.num_processes={PROCESSES}",
        f"--config.distributed.process_id={process_id}",
        f"--config.mesh.node={PROCESSES}",
        f"--config.mesh.gpu={DEVICES}",
        *FLAGS,
    ]
    stderr = logs / f"stderr_{process_id}.txt"
    with stderr.open("w") as err:
        process = subprocess.Popen(
            command, cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err
        )
    return process, stderr


def checkpoint_steps(workdir):
    """Committed checkpoints (orbax renames a finished save to its step number)."""
    directory = Path(workdir) / "checkpoints"
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def read_state(workdir, step):
    """The checkpoint's arrays as host numpy, keyed by their path in the state."""
    path = Path(workdir) / "checkpoints" / str(step) / "state"
    # Saved across two processes' devices: read onto one device of this process instead.
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    with ocp.StandardCheckpointer() as reader:
        target = jax.tree.map(
            lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=device),
            reader.metadata(path).item_metadata,
        )
        state = reader.restore(path, target)
    return {".".join(k): np.asarray(v) for k, v in ocp.tree.to_flat_dict(state).items()}


def final_top1(log):
    """top-1 of each process's final evaluation line."""
    pattern = rf"final eval at step {TOTAL_STEPS}: top-1 ([0-9.]+), top-5 [0-9.]+ over (\d+)"
    return [(float(m.group(1)), int(m.group(2))) for m in re.finditer(pattern, log)]


def saved_config(workdir, step):
    """The config the run saved with the checkpoint of `step`, as a dict."""
    meta = Path(workdir) / "checkpoints" / str(step) / "meta" / "metadata"
    return json.loads(json.loads(meta.read_text())["config"])


# Whether this machine can listen on ::1: the uninterrupted run then does.
IPV6 = mp_util.has_ipv6_loopback()


@pytest.fixture(scope="module")
def launched(env, tmp_path_factory):
    """Workdir and log of an uninterrupted `launch_local.sh 2 2` run.

    Coordinated at [::1] where this machine has an IPv6 loopback, so that the run is also
    test_an_ipv6_coordinator_address_runs's instead of a run of its own (the flag comes after,
    and wins over, the 127.0.0.1 address launch_local.sh picks; the dead-process and
    launcher-signal tests still run with that one).
    """
    workdir = tmp_path_factory.mktemp("launched")
    ipv6 = [f"--config.distributed.coordinator_address=[::1]:{process_per_gpu.free_port()}"]
    log = launch_local(env, workdir, *(ipv6 if IPV6 else []))
    assert log.count("mesh {'node': 2, 'gpu': 2} over 4 cpu devices, 2 processes") == PROCESSES
    assert checkpoint_steps(workdir)[-1] == TOTAL_STEPS
    return workdir, log


def test_launch_local_reaches_the_accuracy_of_one_process(launched, tmp_path):
    _, log = launched
    evaluations = final_top1(log)
    # Both processes report the same global evaluation, of every test image once.
    assert len(evaluations) == PROCESSES and len(set(evaluations)) == 1, log
    (two_processes, examples), _ = evaluations
    assert examples == input_pipeline.DIGITS_TEST_SIZE

    # The same run in one process: the same 2x2 mesh, of 4 devices (this process has 8, so a
    # process of its own). Its final top-1 exactly, as its scalars hold it (float32).
    mesh = (f"--config.mesh.node={PROCESSES}", f"--config.mesh.gpu={DEVICES}")
    result = run_main(
        "--config=configs/digits.py",
        f"--workdir={tmp_path}",
        *FLAGS,
        *mesh,
        devices=PROCESSES * DEVICES,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "over 4 cpu devices, 1 processes" in result.stderr, result.stderr
    one_process = read_scalars(tmp_path)[1][("eval/top1", TOTAL_STEPS)]

    # The two runs differ only in float rounding (gloo sums across processes in another order),
    # ~1e-6 relative after 12 steps: a prediction flips only where two logits are that close.
    # The log prints 4 decimals (+-5e-5).
    assert abs(two_processes - one_process) <= 1 / examples + 5e-5
    # And it trained: chance is 0.1.
    assert two_processes > 0.2


def _two_gpus(env: dict[str, str]) -> dict[str, str]:
    """`env` where CUDA_VISIBLE_DEVICES lists two "GPUs", for main to start a process per GPU
    (`distributed.process_per_gpu=always`); each process simulates DEVICES CPU devices."""
    return {
        **env,
        "CUDA_VISIBLE_DEVICES": "0,1",
        "XLA_FLAGS": f"{env['XLA_FLAGS']} --xla_force_host_platform_device_count={DEVICES}",
        "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo",
    }


def test_main_trains_as_a_process_per_gpu_by_itself_as_launch_local_does(
    env, launched, tmp_path
):
    """`distributed.process_per_gpu=always` where CUDA_VISIBLE_DEVICES lists two "GPUs": main
    starts the job of launch_local.sh 2 2 itself (each process here simulates 2 CPU devices)
    and trains it to the same parameters."""
    reference, reference_log = launched
    split_env = _two_gpus(env)
    result = subprocess.run(
        [sys.executable, "-m", "jia_jax.main", "--config=configs/digits.py",
         f"--workdir={tmp_path}", "--config.distributed.process_per_gpu=always", *FLAGS,
         "--config.mesh.node=-1", "--config.mesh.gpu=-1"],  # digits.py sets 2 x 4: infer it
        check=False, cwd=REPO_ROOT, env=split_env, text=True, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, timeout=RUN_TIMEOUT_S,
    )
    assert result.returncode == 0, result.stdout
    log = result.stdout
    assert log.count("Training as 2 processes of one GPU each") == 1, log
    # The first process's progress alone: the second logs warnings and errors only.
    assert log.count("mesh {'node': 2, 'gpu': 2} over 4 cpu devices, 2 processes") == 1, log
    assert "jax.distributed: process 0 of 2" in log and "process 1 of 2" not in log
    assert final_top1(log) == final_top1(reference_log)[:1]
    assert checkpoint_steps(tmp_path)[-1] == TOTAL_STEPS
    assert_bitwise_equal(read_state(tmp_path, TOTAL_STEPS), read_state(reference, TOTAL_STEPS))


def test_a_mistake_every_trainer_of_main_makes_is_one_line(env, tmp_path):
    """A config value the trainers refuse, not main's launcher: each of the 2 trainers stops on
    it, and the job prints its line once and exits 1."""
    split_env = _two_gpus(env)
    result = subprocess.run(
        [sys.executable, "-m", "jia_jax.main", "--config=configs/digits.py",
         f"--workdir={tmp_path}", "--config.distributed.process_per_gpu=always",
         "--config.mesh.node=-1", "--config.mesh.gpu=-1", "--config.eval_batch_size=3"],
        check=False, cwd=REPO_ROOT, env=split_env, text=True, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, timeout=RUN_TIMEOUT_S,
    )
    assert result.returncode == 1, result.stdout
    errors = [line for line in result.stdout.splitlines() if "eval_batch_size=3" in line]
    assert errors == [errors[0]] and errors[0].startswith("ValueError: "), result.stdout


def test_dead_process_stops_the_survivor_with_one_line_and_restart_resumes_bitwise(
    env, launched, tmp_path
):
    reference, _ = launched
    workdir, logs = tmp_path / "run", tmp_path / "logs"
    logs.mkdir()
    address = f"127.0.0.1:{process_per_gpu.free_port()}"
    started = [start_process(env, workdir, i, address, logs) for i in range(PROCESSES)]
    (survivor, survivor_log), (victim, _) = started
    try:
        # Kill once a checkpoint is committed, well before the end.
        wait_for_checkpoint(workdir, started)
        victim.send_signal(signal.SIGKILL)
        # Raises TimeoutExpired (a failure) if the survivor waits for JAX's own 100 s.
        status = survivor.wait(timeout=HEARTBEAT_TIMEOUT_S + EXIT_SLACK_S)
    finally:
        for process, _ in started:
            process.kill()
            process.wait()

    stderr = survivor_log.read_text()
    assert status == peer_watch.EXIT_STATUS, stderr
    lines = re.findall(r"^.*of 2 stopped .*$", stderr, re.MULTILINE)
    assert len(lines) == 1, stderr
    match = re.search(
        r"\] process 1 of 2 stopped at step (\d+); "
        r"restart the job to resume from step (\d+)$",
        lines[0],
    )
    assert match, lines[0]
    step, resume = int(match.group(1)), int(match.group(2))
    committed = checkpoint_steps(workdir)
    assert resume == committed[-1] and CHECKPOINT_EVERY <= resume <= step < TOTAL_STEPS
    # No abort: no C++ check failure, no dump of the threads.
    for noise in ("Check failure", "Fatal Python error", "Traceback"):
        assert noise not in stderr, stderr

    log = launch_local(env, workdir)
    assert log.count(f"resumed from the checkpoint of step {resume} in") == PROCESSES, log
    assert_bitwise_equal(read_state(workdir, TOTAL_STEPS), read_state(reference, TOTAL_STEPS))


def wait_for_checkpoint(workdir, started):
    """Returns once a checkpoint is committed; fails if a process ended first."""
    while not checkpoint_steps(workdir) and all(p.poll() is None for p, _ in started):
        time.sleep(0.05)
    assert all(p.poll() is None for p, _ in started), [log.read_text() for _, log in started]


def wait_for_log(started, pattern):
    """Returns once every process's log has a line matching `pattern`; fails if one ended."""
    while not all(re.search(pattern, log.read_text(), re.MULTILINE) for _, log in started):
        assert all(p.poll() is None for p, _ in started), [log.read_text() for _, log in started]
        time.sleep(0.05)


def run_job(env, workdir, address, logs, timeout_s, act=lambda started: None):
    """Both processes of a job; `act(started)` once they run. Their exit statuses and stderr."""
    started = [start_process(env, workdir, i, address, logs) for i in range(PROCESSES)]
    try:
        act(started)
        statuses = [process.wait(timeout=timeout_s) for process, _ in started]
    finally:
        for process, _ in started:
            process.kill()
            process.wait()
    return statuses, [log.read_text() for _, log in started]


def test_sigterm_to_one_process_saves_every_process_at_the_same_step(env, launched, tmp_path):
    # The request travels in the step's reduced stop flag: one process of two asking makes it
    # 0.5, and both stop after the same step, save it together and exit 0.
    workdir, logs = tmp_path / "run", tmp_path / "logs"
    logs.mkdir()
    # The job resumes from a copy of the uninterrupted run's checkpoint of step 4, so that it is
    # mid-run at once: no initialisation to compile, 4 steps and a first save fewer (~5 s).
    # Process 1 is asked to stop once both have said so (their signal handlers are in place);
    # both stop ~3 steps later, well before the end.
    resumed = f"resumed from the checkpoint of step {CHECKPOINT_EVERY} "
    step_dir = Path("checkpoints") / str(CHECKPOINT_EVERY)
    shutil.copytree(launched[0] / step_dir, workdir / step_dir)

    def stop_one(started):
        wait_for_log(started, re.escape(resumed))
        started[1][0].send_signal(signal.SIGTERM)

    address = f"127.0.0.1:{process_per_gpu.free_port()}"
    # A few steps and a save are left: a process that waits longer hangs in a collective.
    statuses, stderr = run_job(env, workdir, address, logs, STOP_TIMEOUT_S, stop_one)
    assert statuses == [0, 0], stderr
    assert all(resumed in text for text in stderr), stderr
    pattern = r"Preemption signal: saved the checkpoint of step (\d+)"
    stops = [re.findall(pattern, text) for text in stderr]
    assert len(stops[0]) == 1 and stops[0] == stops[1], stderr
    stop = int(stops[0][0])
    # Past the copied checkpoint: a save of this job's.
    assert CHECKPOINT_EVERY < stop < TOTAL_STEPS and checkpoint_steps(workdir)[-1] == stop
    assert all("final eval" not in text for text in stderr)


@pytest.mark.skipif(not IPV6, reason="no IPv6 loopback here")
def test_an_ipv6_coordinator_address_runs(launched):
    # JAX's coordinator and the peer watch both listen where "[::1]:port" says: the uninterrupted
    # run was given such an address (its saved config says it was), and both processes finished.
    workdir, log = launched  # launch_local asserted its exit status: 0, so both trainers' were
    address = saved_config(workdir, TOTAL_STEPS)["distributed"]["coordinator_address"]
    assert re.fullmatch(r"\[::1\]:\d+", address), address
    assert checkpoint_steps(workdir)[-1] == TOTAL_STEPS
    assert log.count(f"final eval at step {TOTAL_STEPS}") == PROCESSES, log


def test_watch_lines_name_the_process_step_and_checkpoint():
    assert peer_watch.stopped_message([1], 2, 40, 30) == (
        "process 1 of 2 stopped at step 40; restart the job to resume from step 30"
    )
    assert peer_watch.stopped_message([1, 3], 4, None, None) == (
        "processes 1, 3 of 4 stopped before the first step; "
        "restart the job; it starts again from step 0 (no committed checkpoint found)"
    )
    assert peer_watch.failed_message(2, 4, 7, "FloatingPointError: loss is nan") == (
        "process 2 of 4 failed at step 7: FloatingPointError: loss is nan"
    )
    error = ValueError("two\nlines")
    assert peer_watch.one_line(error) == "ValueError: two lines"


# Each process joins the job as the trainer does (`mesh.initialize_distributed`: JAX, gloo and
# the peer watch), meets the others in a collective, and then the processes in FAILING raise the
# same error, 0.3 s apart in that order; the others wait in a collective for them.
_FAILING = """
import os, sys, time
import jax
import ml_collections
from jax.experimental import multihost_utils
from jia_jax import mesh

dist = ml_collections.ConfigDict({
    "coordinator_address": os.environ["MP_COORDINATOR_ADDRESS"],
    "num_processes": int(os.environ["MP_NUM_PROCESSES"]),
    "process_id": int(os.environ["MP_PROCESS_ID"]),
    "heartbeat_timeout_s": int(os.environ["TIMEOUT_S"]),
    "watch_peers": True,
})
peers = mesh.initialize_distributed(dist)
me, failing = jax.process_index(), [int(p) for p in os.environ["FAILING"].split(",")]
try:
    with peers.reporting():
        peers.step = 4
        multihost_utils.sync_global_devices("joined")
        if me in failing:
            time.sleep(0.3 * failing.index(me))
            raise FloatingPointError("loss is nan at step 4")
        multihost_utils.sync_global_devices("never completes")
except FloatingPointError as error:
    sys.exit(f"{type(error).__name__}: {error}")  # as jia_jax.main
"""


@pytest.mark.parametrize("failing", ["0,1", "1,0", "1", "0"])
def test_failed_processes_end_with_their_own_error_and_the_others_name_it(failing):
    """Every process exits 1 with one true line, and none is aborted by JAX.

    A process that left first used to close its watch link without a word: the other reported
    it as stopped (75) and, process 0 having taken JAX's coordination service with it, the
    failing one died of SIGABRT with a C++ fatal message and a dump of every thread.
    """
    # 4 s: these main threads trace nothing but a one-element collective, so no heartbeat (every
    # second) is that late, and the second failing process raises 0.3 s after the first. A process
    # whose peer failed waits this long for an error of its own: case "0" took 14 s with 10.
    env = {"JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo", "FAILING": failing, "TIMEOUT_S": "4"}
    results = mp_util.run_to_exit(_FAILING, initialize=False, env=env, timeout=120)
    failed = [int(p) for p in failing.split(",")]
    for process, (status, stderr) in enumerate(results):
        assert status == peer_watch.FAILED_STATUS, stderr
        for noise in ("Check failure", "Fatal Python error", "Terminating process", "Traceback"):
            assert noise not in stderr, stderr
        lines = re.findall(r"^.*(?: failed | stopped ).*$", stderr, re.MULTILINE)
        if process in failed:
            assert stderr.splitlines()[-1] == "FloatingPointError: loss is nan at step 4", stderr
            assert not lines, stderr
        else:
            assert len(lines) == 1 and lines[0].endswith(
                f"process {failed[0]} of 2 failed at step 4: "
                "FloatingPointError: loss is nan at step 4"
            ), stderr


def test_newest_checkpoint_ignores_unfinished_saves(tmp_path):
    for name in ("4", "8", "12.orbax-checkpoint-tmp-3", "corrupt"):
        (tmp_path / name).mkdir()
    assert liveness.newest_checkpoint(tmp_path) == 8
    assert liveness.newest_checkpoint(tmp_path / "missing") is None


def test_heartbeat_timeout_is_validated_and_jax_waits_longer_than_the_watch():
    assert liveness.initialize_kwargs(7) == {"heartbeat_timeout_seconds": 7}
    # Watched: JAX's own abort must come after the watch's one line.
    watched = liveness.initialize_kwargs(7, watched=True)["heartbeat_timeout_seconds"]
    assert watched > 7 + peer_watch.HEARTBEAT_INTERVAL_S
    with pytest.raises(ValueError, match="heartbeat_timeout_s=0 must be at least 1"):
        liveness.initialize_kwargs(0)
    assert digits.get_config().distributed.heartbeat_timeout_s <= 30


def test_sigterm_to_the_launcher_saves_on_every_trainer_and_leaves_none(env, tmp_path):
    workdir, log_file = tmp_path / "run", tmp_path / "log.txt"
    command = ["scripts/launch_local.sh", str(PROCESSES), str(DEVICES), "configs/digits.py"]
    # Long enough that the signal lands mid-run.
    command += [str(workdir), *FLAGS, "--config.total_steps=100000"]
    trainers = []
    # A file, not a pipe: trainers a launcher left behind would hold a pipe open.
    with log_file.open("w") as out:
        launcher = subprocess.Popen(
            command, cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        # A second step done: both trainers are past compiling and train together.
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not re.search(r"step\s+2/100000 \|", log_file.read_text()):
            assert launcher.poll() is None and time.monotonic() < deadline, log_file.read_text()
            time.sleep(0.1)
        children = Path(f"/proc/{launcher.pid}/task/{launcher.pid}/children")
        trainers = [int(pid) for pid in children.read_text().split()]
        assert len(trainers) == PROCESSES, log_file.read_text()
        launcher.send_signal(signal.SIGTERM)
        status = launcher.wait(timeout=RUN_TIMEOUT_S)
        # At once: a trainer the launcher did not wait for is still saving or exiting now (a
        # second's wait, as before, gave it the time to finish unseen).
        left = [pid for pid in trainers if Path(f"/proc/{pid}").exists()]
    finally:
        launcher.kill()
        for pid in trainers:  # what a failing launcher left behind, so that it ends
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    log = log_file.read_text()
    # The launcher's status is the first failing trainer's: both exited 0.
    assert status == 0, log
    saved = re.findall(r"Preemption signal: saved the checkpoint of step (\d+); exiting\.", log)
    assert len(saved) == PROCESSES and len(set(saved)) == 1, log
    assert checkpoint_steps(workdir)[-1] == int(saved[0])
    assert not left, f"trainers {left} were left behind"
