"""What every benchmark shares: step timing, the budgeted child-process runner, provenance, JSON.

A benchmark module says what it measures (its cases, how one case is built and run, its table);
this module says how it is timed, where it runs and how its record is kept:

  * `time_steps` / `time_train_step`: a step's seconds, synced (each step waited for) and queued
    (one step in flight ahead; the training loop keeps two), and `step_rates` from them;
    `time_loop`: as the training loop runs the step (its stop flags, its metrics fetched late);
  * `run_children` / `worker`: cases in child processes under a wall-clock budget, a child that
    dies losing only the case it was running, its rows rewritten to a file after every case;
  * `environment`: commit, devices and versions of the run; `write_json`: the record, atomically;
  * `run_logged` / `trainer_progress`: a trainer command's output, and the figures of
    `jia_jax.main`'s progress lines in it, for benchmarks that run the trainer itself.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

# Back-to-back calls per sample are capped so that pipelined outputs of large buffers stay small.
_MAX_CALLS_PER_SAMPLE = 64
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# `jia_jax.metrics.format_progress`: the step is padded to the width of the total.
PROGRESS = re.compile(
    r"step\s+(\d+)/\d+ \|.*?\| loss ([\d.eE+-]+|nan|inf) \|(?:.*?\|)? ([\d.]+) img/s \|"
)
# The field right after `img/s |` in lines logged since the trainer measured input wait; on the
# GPU input path followed by its input thread's waits, ` (read 3.1, decode 25 ms a batch)`.
_INPUT_WAIT = re.compile(r" input wait (\d+)%(?: \(([^)]*) ms a batch\))? \|")
# The field after the input wait in lines logged since the trainer measured its step calls.
_LAUNCH = re.compile(r" launch ([\d.]+) ms a step \|")


# ---------------------------------------------------------------------------------------------
# Timing


def time_steps(step, state, batch, steps: int, queued: bool) -> tuple[Any, list[float]]:
    """Seconds per step, one sample per step: synced or queued.

    Synced: each step is waited for before the next is dispatched (dispatch + device time).
    Queued: one step in flight ahead (the training loop keeps two): step t+1 is dispatched, then
    step t's metrics are waited for; a sample is the time between two such completions, so the
    queue never drains and the device time between steps is what training sees. It runs
    `steps + 2` steps (before the second was added, queued timing gave `steps - 1` samples:
    `bench_peers_*_1xH100.json` hold 19 for `--steps=20`).
    """
    samples, prev, last = [], None, None
    # Queued: the first completion starts the clock, so `steps` samples take `steps + 2` steps.
    for _ in range(steps + 2 if queued else steps):
        start = time.perf_counter()
        state, metrics = step(state, batch)
        if not queued:
            jax.block_until_ready(metrics)
            samples.append(time.perf_counter() - start)
            continue
        if prev is not None:
            jax.block_until_ready(prev)
            now = time.perf_counter()
            if last is not None:
                samples.append(now - last)
            last = now
        prev = metrics
    jax.block_until_ready(state)
    return state, samples


def time_loop(step, state, batch, stop, steps: int, lag: int) -> tuple[Any, list[float]]:
    """Seconds per step timed as `jia_jax.loop` runs the step: each call passes the stop flags
    (`train.stop_flags`), then fetches to host (`metrics.LaggedFetch`) the metrics of the step
    `lag` calls back, so up to `lag + 1` steps are in flight; a sample is the time between two
    such fetches. `steps` samples take `steps + lag + 1` steps."""
    from jia_jax import metrics as metrics_lib  # pylint: disable=import-outside-toplevel

    pending = metrics_lib.LaggedFetch(finite_keys=(), lag=lag)
    samples, last = [], None
    for t in range(steps + lag + 1):
        state, metrics = step(state, batch, stop)
        if pending.push(t, metrics) is None:
            continue
        now = time.perf_counter()
        if last is not None:
            samples.append(now - last)
        last = now
    pending.flush()
    jax.block_until_ready(state)
    return state, samples


def time_train_step(
    step, state, batch, steps: int, warmup_steps: int
) -> tuple[Any, list[float], list[float]]:
    """`warmup_steps` steps, then `steps` synced and `steps` queued: (state, synced, queued)."""
    for _ in range(warmup_steps):
        state, _ = step(state, batch)
    jax.block_until_ready(state)
    state, synced = time_steps(step, state, batch, steps, queued=False)
    state, queued = time_steps(step, state, batch, steps, queued=True)
    return state, synced, queued


def step_rates(batch: int, synced: list[float], queued: list[float]) -> dict[str, Any]:
    """The record's step figures: medians of the queued samples (what training sees) and of the
    synced ones, and the images/s of `batch` images per step; also over the queued samples' mean
    (`mean_images_per_s`), which keeps the slow steps a median drops, as a training run's
    logged interval keeps them (across a network whose link stalls now and then, they differ)."""
    step, synced_step = statistics.median(queued), statistics.median(synced)
    return {
        "step_time_s": step,
        "samples_s": queued,
        "images_per_s": batch / step,
        "mean_images_per_s": batch / statistics.mean(queued),
        "synced_step_time_s": synced_step,
        "synced_samples_s": synced,
        "synced_images_per_s": batch / synced_step,
    }


def time_calls(
    fn: Callable[[Any], Any], arg: Any, repeats: int, min_sample_s: float
) -> dict[str, Any]:
    """Compiles `fn` for `arg`, warms up, and returns the median seconds per call and details."""
    start = time.perf_counter()
    compiled = fn.lower(arg).compile()
    compile_s = time.perf_counter() - start
    return {**time_compiled(compiled, arg, repeats, min_sample_s), "compile_s": compile_s}


def time_compiled(
    compiled: Callable[[Any], Any], arg: Any, repeats: int, min_sample_s: float
) -> dict[str, Any]:
    """Warms up a compiled program and returns the median seconds per call of `repeats` samples,
    each of as many calls (waited for at its end) as take `min_sample_s`."""
    jax.block_until_ready(compiled(arg))
    start = time.perf_counter()
    jax.block_until_ready(compiled(arg))
    single = time.perf_counter() - start
    calls = max(1, min(_MAX_CALLS_PER_SAMPLE, math.ceil(min_sample_s / single)))
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            out = compiled(arg)
        jax.block_until_ready(out)
        samples.append((time.perf_counter() - start) / calls)
    return {
        "time_s": statistics.median(samples),
        "samples_s": samples,
        "calls_per_sample": calls,
    }


def time_in_program(
    fn: Callable[[Any, jax.Array], Any], arg: Any, repeats: int, extra_iterations: int
) -> dict[str, Any]:
    """Device seconds of one reduction: (time of 1 + k iterations - time of 1) / k.

    Each sample is one call, synced; the median of `repeats` samples is taken for both counts.
    """
    one, more = jnp.int32(1), jnp.int32(1 + extra_iterations)
    start = time.perf_counter()
    compiled = fn.lower(arg, one).compile()
    compile_s = time.perf_counter() - start

    def sample(iterations: jax.Array) -> float:
        start = time.perf_counter()
        jax.block_until_ready(compiled(arg, iterations))
        return time.perf_counter() - start

    for _ in range(2):
        sample(one), sample(more)
    ones = [sample(one) for _ in range(repeats)]
    mores = [sample(more) for _ in range(repeats)]
    per_iteration = (statistics.median(mores) - statistics.median(ones)) / extra_iterations
    return {
        "time_s": per_iteration,
        "program_1_iteration_s": statistics.median(ones),
        f"program_{1 + extra_iterations}_iterations_s": statistics.median(mores),
        "in_program_compile_s": compile_s,
    }


# ---------------------------------------------------------------------------------------------
# Provenance and the record


def environment() -> dict[str, Any]:
    """Software, hardware and source revision of this run (initialises JAX's backend)."""

    def git(*args: str) -> str:
        try:
            return subprocess.run(
                ["git", *args], capture_output=True, text=True, check=True, cwd=REPO
            ).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return "unknown"

    device = jax.devices()[0]
    return {
        "git_rev": git("rev-parse", "HEAD"),
        "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "jax_version": jax.__version__,
        "backend": jax.default_backend(),
        "device_kind": device.device_kind,
        "device_count": jax.device_count(),
        "process_count": jax.process_count(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        # CUDA's hardware queues (8 unless set): the GPU decoder's speed beside training
        # depends on them (jia_jax/gpu_decode.py).
        "cuda_device_max_connections": os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS", ""),
        "host": platform.node(),
    }


def entry_lines(hlo: str) -> list[str]:
    """The instruction lines of an HLO module's entry computation (its header line first)."""
    return hlo.split("\nENTRY", 1)[1].split("\n}\n", 1)[0].splitlines()


def error_text(e: BaseException, limit: int = 2000, tail: bool = False) -> str:
    """``Type: message`` of a case that failed, for its row: the checkout's absolute root made
    relative (a traceback's paths name the repository's files, not the machine's), at most `limit`
    characters, the first ones or with `tail` the last."""
    text = f"{type(e).__name__}: {e}".replace(REPO + os.sep, "")
    return text[-limit:] if tail else text[:limit]


def write_json(path: str, doc: dict[str, Any]) -> None:
    """Writes `doc` to `path` atomically, so a killed run never leaves half a file."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, path)


def close_record(path: str, doc: dict[str, Any]) -> None:
    """Adds the environment to a benchmark's record and writes it: for benchmarks whose children
    use the GPUs, read last, since JAX initialised in the parent would hold the GPUs' memory."""
    doc["environment"] = environment()
    write_json(path, doc)


# Seconds a timed-out command has after SIGTERM (the trainers save a checkpoint and exit).
_GRACE_S = 60.0


def run_logged(
    command: Sequence[str],
    env: dict[str, str] | None = None,
    timeout: float | None = None,
    cwd: str | None = None,
    each_second: Callable[[int], None] | None = None,
) -> tuple[int, str]:
    """Runs `command` from `cwd` (the repository root by default): its exit status and output;
    `each_second(pid)`, if given, is called with the child's pid about every second it runs.

    Past `timeout` seconds it is sent SIGTERM, then SIGKILL if it still runs a minute later, and
    the status is 124 with a last line saying so. SIGTERM first: scripts/launch_local.sh forwards
    it to its trainers, which run in process groups of their own and would outlive a killed
    launcher, holding the GPUs the next run needs.
    """
    proc = subprocess.Popen(
        list(command),
        cwd=cwd or REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(command, timeout)
            wait = left if each_second is None else min(1.0, 1.0 if left is None else left)
            try:
                out, err = proc.communicate(timeout=wait)
                return proc.returncode, out + err
            except subprocess.TimeoutExpired:  # waiting again loses no output (subprocess docs)
                if each_second is not None:
                    each_second(proc.pid)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            out, err = proc.communicate(timeout=_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        return 124, f"{out}{err}\ntimed out after {timeout:g} s: stopped\n"


def trainer_progress(log: str) -> list[dict[str, Any]]:
    """Step, loss, images/s, input wait and launch time of each logged step of a `jia_jax.main`
    log, in order.

    `input_wait` is the fraction of the interval the loop waited for input (the line's percent
    / 100), None in lines without the field (logs from before it was added); `input_stages_ms`
    the input thread's waits in ms a batch by stage where the line gives them (the GPU path);
    `launch_ms` the host's ms a step in the step's call where the line gives it.
    Every process of a multi-process run (scripts/launch_local.sh) logs each step's line, with
    the global images/s it measured over the same steps: a step's first line counts, once.
    """
    steps: dict[int, dict[str, Any]] = {}
    for found in PROGRESS.finditer(log):
        step, loss, rate = found.groups()
        wait = _INPUT_WAIT.match(log, found.end())
        line = {
            "step": int(step),
            "loss": float(loss),
            "images_per_s": float(rate),
            "input_wait": int(wait[1]) / 100 if wait else None,
        }
        if wait and wait[2]:
            stages = (field.rsplit(" ", 1) for field in wait[2].split(", "))
            line["input_stages_ms"] = {name: float(ms) for name, ms in stages}
        launch = _LAUNCH.match(log, wait.end()) if wait else None
        if launch:
            line["launch_ms"] = float(launch[1])
        steps.setdefault(int(step), line)
    return list(steps.values())


# ---------------------------------------------------------------------------------------------
# Budgeted child processes

Measure = Callable[[dict[str, Any], argparse.Namespace, dict[str, Any]], dict[str, Any]]


def worker(
    spec_path: str,
    measure: Measure,
    describe: Callable[[dict[str, Any]], str] = str,
    provenance: Callable[[], dict[str, Any]] | None = environment,
) -> None:
    """Child process: measures the spec's cases before its deadline, rewriting its record after
    each case, so that the parent (or a person) finds every finished row if the child dies.

    `measure(case, args, cache)` returns the case's row; `cache` lives as long as the child (a
    built model, a compiled step) and is emptied after a failure. A case whose model's longest
    case so far would end past the deadline is recorded as skipped. `provenance` (None: none)
    is called before the first case; a child that must not initialise JAX passes None.
    """
    with open(spec_path) as f:
        spec = json.load(f)
    args = argparse.Namespace(**spec["args"])
    doc = {"environment": provenance() if provenance else {}, "results": []}
    cache: dict[str, Any] = {}
    wall: dict[str, float] = dict(spec["estimates_s"])  # longest case so far, per model
    for case in spec["cases"]:
        row: dict[str, Any] = dict(case)
        model = str(case.get("model"))
        if time.time() + wall.get(model, 0.0) > spec["deadline"]:
            row["skipped"] = "budget_s"
        else:
            start = time.perf_counter()
            try:
                row.update(measure(case, args, cache))
            except Exception as e:  # pylint: disable=broad-except
                # One failing case (e.g. out of memory) must not lose the others.
                row["error"] = error_text(e)
                cache.clear()
            row["wall_s"] = time.perf_counter() - start
            wall[model] = max(wall.get(model, 0.0), row["wall_s"])
        doc["results"].append(row)
        write_json(spec["out"], doc)
        print(f"[{len(doc['results'])}/{len(spec['cases'])}] {describe(row)}", flush=True)


def run_children(
    module: str,
    cases: Sequence[dict[str, Any]],
    args: argparse.Namespace,
    deadline: float,
    out: str,
    grace_s: float = 120.0,
    extra_flags: str = "",
    estimates_s: dict[str, float] | None = None,
    cases_per_child: int | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Runs `cases` in children `python -m module --worker_spec <file>` (which call `worker`),
    with `extra_flags` appended to XLA_FLAGS (XLA reads them once, at start-up).

    A child that dies (e.g. a fatal CUDA error) is charged with the case it was running, and a new
    child takes the cases after it; one still running `grace_s` after the deadline is killed and
    its unreached cases are marked. `cases_per_child` (None: all) starts a fresh child after that
    many cases (for kinds that must not share a process). Nothing is raised.

    Returns:
      The first child's non-empty environment record and one result row per case, in order.
    """
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {extra_flags}".strip()
    environment_doc: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    remaining = list(cases)
    while remaining:
        batch = remaining[:cases_per_child] if cases_per_child else remaining
        spec = {
            "args": {k: v for k, v in vars(args).items() if _is_json(v)},
            "cases": batch,
            "deadline": deadline,
            "out": out,
            "estimates_s": estimates_s or {},
        }
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(spec, f)
        try:
            proc = subprocess.run(
                [sys.executable, "-m", module, "--worker_spec", f.name],
                cwd=REPO,
                env=env,
                timeout=None
                if math.isinf(deadline)
                else max(1.0, deadline - time.time()) + grace_s,
                check=False,
            )
            failure = f"worker exited with status {proc.returncode}" if proc.returncode else None
        except subprocess.TimeoutExpired:
            failure = "worker killed: ran past budget_s + grace_s"
        finally:
            os.unlink(f.name)
        try:
            # The child's rows sit in `out` until here: they survive if the parent is killed.
            with open(out) as g:
                doc = json.load(g)
            os.remove(out)
        except (OSError, ValueError):
            doc = {"environment": {}, "results": []}
        environment_doc = environment_doc or doc["environment"]
        rows.extend(doc["results"])
        remaining = remaining[len(doc["results"]) :]
        unreached = batch[len(doc["results"]) :]
        if unreached:
            timed_out = failure is not None and failure.startswith("worker killed")
            lost = remaining if timed_out else remaining[:1]
            rows.extend({**c, "error": failure or "worker ended early"} for c in lost)
            remaining = remaining[len(lost) :]
    return environment_doc, rows


def _is_json(value: Any) -> bool:
    try:
        json.dumps(value)
    except TypeError:
        return False
    return True


def strings(text: str) -> list[str]:
    """A comma-separated flag value as a list."""
    return [v for v in text.split(",") if v]


def floats(text: str) -> list[float]:
    """A comma-separated flag value as floats."""
    return [float(v) for v in text.split(",") if v]
