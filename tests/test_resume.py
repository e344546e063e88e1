"""End to end: the trainer CLI is stopped (SIGTERM, SIGKILL) or finds a damaged or foreign
checkpoint, and every run that resumes ends bitwise equal to one that was never interrupted.

Each training run is `python -m jia_jax.main` in a subprocess (a tiny ResNet-18 on 8x8 digits,
2x4 mesh of simulated CPU devices, 12 steps). The runs share a persistent XLA compilation cache,
so only the first one compiles. Checkpoints are read back with orbax directly, independently of
`jia_jax.checkpoint`. The foreign-checkpoint test calls the trainer in this process instead: it
stops before compiling anything.
"""

import hashlib
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import orbax.checkpoint as ocp
import pytest

from configs import digits
from jia_jax import checkpoint_layout
from jia_jax import loop
from jia_jax import metrics
from jia_jax import recipe

REPO_ROOT = Path(__file__).resolve().parents[1]
TOTAL_STEPS = 12
# Few saves (each costs about a second of host time here); orbax also saves the first step.
CHECKPOINT_EVERY = 6
# A stop lands on whatever step the signal reaches (jia_jax.loop): mostly off the checkpoint
# interval, a save of its own.
# Every checkpoint is kept so that any step can be compared with the uninterrupted run's;
# warmup is 0.2 epochs (4 steps) of the 12.
OVERRIDES = {
    "model.width": 4,
    "data.image_size": 8,
    "checkpoint_every_steps": CHECKPOINT_EVERY,
    "checkpoint_keep": 10,
    "log_every_steps": 1,
    "optimizer.warmup_epochs": 0.2,
}
# Generous: the first run compiles, and the CI box may be busy.
RUN_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    cache = tmp_path_factory.mktemp("xla_cache")
    return {
        **os.environ,  # with conftest.py's XLA_FLAGS: 8 devices, cheap CPU compiles, every run
        "JAX_PLATFORMS": "cpu",
        "JAX_COMPILATION_CACHE_DIR": str(cache),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1",
    }


def start(env, workdir):
    command = [
        sys.executable,
        "-m",
        "jia_jax.main",
        "--config=configs/digits.py",
        f"--workdir={workdir}",
        f"--config.total_steps={TOTAL_STEPS}",
    ]
    command += [f"--config.{name}={value}" for name, value in OVERRIDES.items()]
    return subprocess.Popen(
        command, cwd=REPO_ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )


def run_to_end(env, workdir):
    """Runs the trainer until it exits by itself; returns its log."""
    process = start(env, workdir)
    try:
        log, _ = process.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        process.kill()
    assert process.returncode == 0, log
    return log


def read_until(process, pattern):
    """Consumes the process's log up to the first line matching `pattern`; returns the lines."""
    lines = []
    for line in process.stdout:
        lines.append(line)
        if re.search(pattern, line):
            return lines
    process.wait()
    pytest.fail(
        f"the trainer ended (code {process.returncode}) before a line matched "
        f"{pattern!r}:\n{''.join(lines)}"
    )


def progress_line(step):
    return rf"step\s+{step}/{TOTAL_STEPS} \|"


def checkpoint_steps(workdir):
    """Steps of the committed checkpoints (orbax renames a finished save to its step number)."""
    directory = Path(workdir) / "checkpoints"
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def read_state(workdir, step):
    """The checkpoint's arrays as host numpy, keyed by their path in the state."""
    with ocp.StandardCheckpointer() as reader:
        state = reader.restore(Path(workdir) / "checkpoints" / str(step) / "state")
    return {".".join(k): np.asarray(v) for k, v in ocp.tree.to_flat_dict(state).items()}


def assert_bitwise_equal(state, reference):
    assert state.keys() == reference.keys()
    different = [
        k
        for k in reference
        if (state[k].dtype, state[k].shape, state[k].tobytes())
        != (reference[k].dtype, reference[k].shape, reference[k].tobytes())
    ]
    assert not different, f"{len(different)} of {len(reference)} arrays differ: {different[:5]}"


def resumed_step(log):
    match = re.search(r"resumed from the checkpoint of step (\d+)", log)
    return int(match.group(1)) if match else None


def file_digests(directory):
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(Path(directory).rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def reference(env, tmp_path_factory):
    """Workdir of the uninterrupted run of TOTAL_STEPS."""
    workdir = tmp_path_factory.mktemp("reference")
    log = run_to_end(env, workdir)
    assert resumed_step(log) is None
    assert checkpoint_steps(workdir)[-1] == TOTAL_STEPS
    return workdir


def test_sigterm_saves_exits_zero_and_resumes_bitwise(env, reference, tmp_path):
    process = start(env, tmp_path)
    try:
        # The handler is installed before the first step, so it is in place once step 1 logs.
        head = read_until(process, progress_line(1))
        process.send_signal(signal.SIGTERM)
        rest, _ = process.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        process.kill()
    log = "".join(head) + rest
    assert process.returncode == 0, log
    match = re.search(r"Preemption signal: saved the checkpoint of step (\d+)", log)
    assert match, log
    stop = int(match.group(1))
    # The signal arrives long before the last step, so the resumed run has steps left to do.
    assert stop < TOTAL_STEPS, log
    assert checkpoint_steps(tmp_path)[-1] == stop
    assert read_state(tmp_path, stop)["step"] == stop
    assert "final eval" not in log

    log = run_to_end(env, tmp_path)
    assert resumed_step(log) == stop
    assert re.search(progress_line(stop + 1), log) and not re.search(progress_line(stop), log)
    assert_bitwise_equal(read_state(tmp_path, TOTAL_STEPS), read_state(reference, TOTAL_STEPS))


def test_sigkill_loses_no_committed_checkpoint_and_resumes_bitwise(env, reference, tmp_path):
    # Seed 3 kills 0.18 s after step 5 logs, about when the step-6 save is in flight.
    rng = random.Random(3)
    kill_after_step, delay_s = rng.randint(2, TOTAL_STEPS - 2), rng.uniform(0.0, 0.3)
    process = start(env, tmp_path)
    try:
        read_until(process, progress_line(kill_after_step))
        # Sleeping with the pipe unread is safe: the rest of the log fits the pipe's buffer.
        time.sleep(delay_s)
        before_kill = checkpoint_steps(tmp_path)
        process.send_signal(signal.SIGKILL)
        process.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        process.kill()
    assert process.returncode == -signal.SIGKILL, "the run ended before it could be killed"

    after_kill = checkpoint_steps(tmp_path)
    assert set(before_kill) <= set(after_kill)
    reference_steps = set(checkpoint_steps(reference))
    for step in after_kill:
        state = read_state(tmp_path, step)  # every committed checkpoint is complete
        assert state["step"] == step
        if step in reference_steps:
            assert_bitwise_equal(state, read_state(reference, step))

    log = run_to_end(env, tmp_path)
    assert resumed_step(log) == (after_kill[-1] if after_kill else None), log
    assert_bitwise_equal(read_state(tmp_path, TOTAL_STEPS), read_state(reference, TOTAL_STEPS))
    # An interrupted save leaves a temporary directory; the next run cleans it up.
    leftovers = [p.name for p in (tmp_path / "checkpoints").iterdir() if not p.name.isdigit()]
    assert not leftovers, leftovers


def test_truncated_latest_checkpoint_falls_back_to_previous(env, reference, tmp_path):
    workdir = tmp_path / "run"
    shutil.copytree(reference, workdir)
    latest = workdir / "checkpoints" / str(TOTAL_STEPS)
    # OCDBT keeps the array chunks in the files of "d/" folders.
    array_files = [p for p in (latest / "state").rglob("*") if p.is_file() and p.parent.name == "d"]
    assert array_files
    for path in array_files:
        os.truncate(path, path.stat().st_size // 2)

    log = run_to_end(env, workdir)
    previous = TOTAL_STEPS - CHECKPOINT_EVERY
    # One short warning line names the moved step, where it went and the step resumed from; no
    # TensorStore specs (the error is in a file beside the moved checkpoint), tracebacks or
    # asyncio reports around it.
    warnings = [line for line in log.splitlines() if not line.startswith("I")]
    assert len(warnings) == 1, log
    [warning] = warnings
    moved_to = workdir / "checkpoints" / "corrupt" / str(TOTAL_STEPS)
    assert re.search(
        rf"\] Moved the unreadable checkpoint of step {TOTAL_STEPS} to {moved_to} \(why: "
        rf"unreadable_process_\*\.txt in it\); resuming from the checkpoint of step {previous}\.$",
        warning,
    ), log
    assert len(warning.partition("] ")[2]) < 200 + len(str(workdir)), warning
    assert "Error" in (moved_to / "unreadable_process_0.txt").read_text()
    # Beside the progress lines: the mesh, the warning, "resumed from", the final evaluation.
    others = [line for line in log.splitlines() if not re.search(progress_line(r"\d+"), line)]
    assert len(others) <= 4, log
    assert resumed_step(log) == previous
    progress = re.findall(r"step\s+\d+/\d+ \|.*", log)
    assert len(progress) == TOTAL_STEPS - previous, log
    assert int(re.search(r"step\s+(\d+)/", progress[0]).group(1)) == previous + 1
    # Its step compiled, after the restore: not training, so no rate; the next ones have one.
    assert "img/s" not in progress[0] and "ETA" not in progress[0], log
    rate = r" [\d.]+ img/s \| input wait \d+% (?:\| launch ([\d.]+) ms a step )?\| ETA "
    assert all(re.search(rate, line) for line in progress[1:]), log
    # The steps' calls made in an interval: a time in the lines of those that had some.
    assert any(float(re.search(rate, line)[1] or 0) > 0 for line in progress[1:]), log
    # Kept for inspection, out of the way of the resumed run's own save of that step.
    assert (workdir / "checkpoints" / "corrupt" / str(TOTAL_STEPS) / "state").is_dir()
    assert_bitwise_equal(read_state(workdir, TOTAL_STEPS), read_state(reference, TOTAL_STEPS))


def test_no_readable_checkpoint_is_one_line(env, reference, tmp_path):
    """Every checkpoint's array metadata gone: orbax's own lines about each ("provide a
    CheckpointHandlerRegistry", "Metadata file does not exist") stay off the console."""
    workdir = tmp_path / "run"
    shutil.copytree(reference, workdir)
    for metadata in (workdir / "checkpoints").glob("*/state/_METADATA"):
        metadata.unlink()
    process = start(env, workdir)
    log, _ = process.communicate(timeout=RUN_TIMEOUT_S)
    lines = log.strip().splitlines()
    assert process.returncode == 1 and len(lines) == 2, log  # the mesh line, then the error
    assert re.match(
        rf"NoReadableCheckpointError: No checkpoint in {workdir}/checkpoints could be read\. "
        rf"Moved the unreadable checkpoint of step {TOTAL_STEPS} to .* Rerun to start from step "
        r"0 in this --workdir, or use a new --workdir\.$",
        lines[1],
    ), log


def test_checkpoint_of_another_model_fails_clearly_and_is_untouched(reference, tmp_path):
    workdir = tmp_path / "run"
    shutil.copytree(reference, workdir)
    before = file_digests(workdir / "checkpoints")
    config = configured({**OVERRIDES, "total_steps": TOTAL_STEPS, "model.width": 8})

    # In this process: the run stops before it compiles anything.
    with pytest.raises(checkpoint_layout.CheckpointMismatchError) as info:
        loop.train_and_evaluate(config, str(workdir))
    message = str(info.value)
    assert f"The checkpoint at step {TOTAL_STEPS}" in message and "does not match" in message
    # Names arrays that differ and both shapes: the first stage has `width` channels.
    assert re.search(
        r"\n  \S+: checkpoint float32\[(\d+, )*4\], state float32\[(\d+, )*8\]\n", message
    ), message
    assert "new --workdir" in message
    assert file_digests(workdir / "checkpoints") == before


def configured(overrides):
    """The digits config with `overrides` ({"a.b": value}) applied, as the CLI would."""
    config = digits.get_config()
    for name, value in overrides.items():
        *parents, field = name.split(".")
        node = config
        for parent in parents:
            node = node[parent]
        node[field] = value
    return config


def test_changed_recipe_stops_before_training_unless_allowed(reference, tmp_path):
    workdir = tmp_path / "run"
    shutil.copytree(reference, workdir)
    before = file_digests(workdir / "checkpoints")
    # A doubled learning rate: the same arrays, another run. The mesh may change freely.
    changed = {
        **OVERRIDES,
        "total_steps": TOTAL_STEPS,
        "optimizer.base_learning_rate": 0.8,
        "mesh.node": 4,
        "mesh.gpu": 2,
    }
    with pytest.raises(recipe.ConfigChangedError) as info:
        loop.train_and_evaluate(configured(changed), str(workdir))
    assert re.findall(r"\n  (.*)", str(info.value)) == [
        "optimizer.base_learning_rate: 0.4 -> 0.8",
        "optimizer.learning_rate: 0.1 -> 0.2",
    ]
    assert file_digests(workdir / "checkpoints") == before

    # Opted in, it resumes; the checkpoint is the last step's, so it only evaluates.
    results = loop.train_and_evaluate(
        configured({**changed, "allow_config_change": True}), str(workdir)
    )
    assert results["eval/examples"] == 360  # the digits test split, each example once
    assert file_digests(workdir / "checkpoints") == before


def test_divergence_never_checkpoints_a_non_finite_state(tmp_path):
    """Regression: a NaN state landing on a checkpoint step (here the last step) was saved before
    its loss was checked; the rerun then evaluated NaN parameters and exited 0."""
    # Step 1's update (learning rate 2.5e29) leaves finite parameters, and a loss at step 2, the
    # last, that is not: one finite save before it (each costs ~2 s on 8 devices here).
    config = configured(
        {
            **OVERRIDES,
            "total_steps": 2,
            "checkpoint_every_steps": 1,
            "optimizer.base_learning_rate": 1e30,
            "optimizer.warmup_epochs": 0.0,
        }
    )
    with pytest.raises(metrics.NonFiniteLossError, match=r"diverged (at|by) step \d+") as info:
        loop.train_and_evaluate(config, str(tmp_path))
    diverged = int(re.search(r"step (\d+)", str(info.value)).group(1))
    saved = checkpoint_steps(tmp_path)
    # Every step saves, so the newest checkpoint is the step before the one named.
    assert saved and saved[-1] == diverged - 1, (saved, str(info.value))
    for step in saved:
        state = read_state(tmp_path, step)
        assert all(np.isfinite(array).all() for array in state.values()), step

    # The rerun resumes from that last finite state, and diverges again: no silent exit 0.
    with pytest.raises(metrics.NonFiniteLossError):
        loop.train_and_evaluate(config, str(tmp_path))


def test_fp16_run_that_only_overflows_stops_instead_of_finishing_untrained(tmp_path):
    """An fp16 run whose every step overflows skips them all and finished with exit 0 and
    untrained parameters. With the loss scale's floor at 2^40 every step's scaled gradients
    overflow fp16 (max 65,504) at the floor, so the third skipped step in a row must stop it."""
    config = configured(
        {
            **OVERRIDES,
            "total_steps": 6,
            "checkpoint_every_steps": 100,
            "precision.compute": "float16",
            "precision.loss_scale.initial": 2.0**40,
            "precision.loss_scale.minimum": 2.0**40,
            "precision.loss_scale.max_skips_at_minimum": 3,
        }
    )
    with pytest.raises(metrics.NonFiniteLossError, match=r"diverged by step 3: its last 3 steps"):
        loop.train_and_evaluate(config, str(tmp_path))
    assert checkpoint_steps(tmp_path) == []  # nothing untrained was committed either
