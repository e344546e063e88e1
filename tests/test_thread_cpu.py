"""Tests for scripts/bench/thread_cpu.py (a process's CPU by thread, from /proc) and its use by
scripts/bench/train_input.py's --thread_cpu and the harness's per-second callback."""

import argparse
import datetime
import os
import sys
import threading
import time

import pytest

from jia_jax import os_thread_names
from scripts.bench import harness, thread_cpu
from scripts.bench import train_input as bench_train_input

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _wall(clock: str) -> float:
    """time.time() of today's local `clock` ("HH:MM:SS.ffffff"), as absl's lines write it."""
    day = datetime.date.today().isoformat()
    return datetime.datetime.fromisoformat(f"{day}T{clock}").timestamp()


def test_shares_are_cpu_seconds_a_second_by_thread_name(monkeypatch):
    monkeypatch.setattr(thread_cpu, "TICKS_PER_S", 100)
    first = thread_cpu.Sample(
        pid=10, wall=5.0,
        threads={10: ("main.py", 100), 11: ("decode_0", 0), 12: ("tf_XLAEigen", 10),
                 13: ("tf_XLAEigen", 5)},
        children={20: 0},
    )
    last = thread_cpu.Sample(
        pid=10, wall=7.0,
        threads={10: ("main.py", 300), 11: ("decode_0", 50), 12: ("tf_XLAEigen", 20),
                 13: ("tf_XLAEigen", 25), 14: ("gpu-input", 10),  # 14, 15 started in between
                 15: ("main.py", 4)},
        children={20: 100, 21: 50},
    )
    # 2 s apart, 100 ticks a second: main 200 ticks, children 150, the two XLA threads 30.
    assert thread_cpu.shares(first, last) == {
        thread_cpu.MAIN: 1.0, thread_cpu.CHILDREN: 0.75, "decode_0": 0.25,
        "tf_XLAEigen": 0.15, "gpu-input": 0.05, thread_cpu.UNNAMED: 0.02,
    }
    assert list(thread_cpu.shares(first, last))[:2] == [thread_cpu.MAIN, thread_cpu.CHILDREN]
    with pytest.raises(ValueError, match="one process"):
        thread_cpu.shares(last, first)


def test_a_spinning_thread_takes_more_cpu_than_a_waiting_one():
    """Sampled from this process: a thread named `spinner` that computes for 0.3 s of its own
    CPU time shows more CPU a second than one named `waiter` that only waits."""
    stop, spun = threading.Event(), threading.Event()

    def spin():
        os_thread_names.name_current_thread("spinner")
        start = time.thread_time()
        while time.thread_time() - start < 0.3:
            pass
        spun.set()
        stop.wait()

    def wait():
        os_thread_names.name_current_thread("waiter")
        stop.wait()

    waiter = threading.Thread(target=wait)
    waiter.start()
    first = thread_cpu.sample(os.getpid(), time.time())
    spinner = threading.Thread(target=spin)
    spinner.start()
    spun.wait()
    last = thread_cpu.sample(os.getpid(), time.time())
    stop.set()
    spinner.join()
    waiter.join()
    shares = thread_cpu.shares(first, last)
    assert shares["spinner"] > shares.get("waiter", 0.0)
    assert threading.get_native_id() in last.threads  # this (main) thread is sampled too


def test_the_window_spans_the_progress_lines_after_the_first_interval():
    log = "\n".join([
        "I1129 12:00:00.100000 1 loop.py:99] compiling",
        "I1129 12:00:01.500000 1 loop.py:313] step 2/6 | loss 1.0 | 10.0 img/s",
        "I1129 12:00:03.000000 1 loop.py:313] step 4/6 | loss 1.0 | 10.0 img/s",
        "I1129 12:00:05.000000 1 loop.py:313] step 6/6 | loss 1.0 | 10.0 img/s",
        "I1129 12:00:06.000000 1 loop.py:387] final eval",
    ])
    samples = [thread_cpu.Sample(1, _wall(f"12:00:0{s}.000000"), {}, {}) for s in range(8)]
    first, last = thread_cpu.steady_window(samples, log)
    assert (first.wall, last.wall) == (_wall("12:00:02.000000"), _wall("12:00:05.000000"))
    assert thread_cpu.steady_window(samples[:3], log) is None  # one sample inside
    assert thread_cpu.steady_window(samples, log.splitlines()[1]) is None  # one progress line


def test_the_window_opens_at_a_step_padded_to_the_last_ones_width():
    """Regression: `step  250/1000`, as the loop pads it, was not read as a progress line, so
    the window opened at the first step as wide as the last (or was None: one such line)."""
    log = "\n".join([
        "I1129 12:00:01.000000 1 loop.py:330] step  250/1000 | loss 1.0 | 10.0 img/s",
        "I1129 12:00:02.000000 1 loop.py:330] step  500/1000 | loss 1.0 | 10.0 img/s",
        "I1129 12:00:04.000000 1 loop.py:330] step 1000/1000 | loss 1.0 | 10.0 img/s",
    ])
    assert thread_cpu.progress_window(log) == (43201.0, 43204.0)


def test_the_harness_calls_back_each_second_with_the_childs_pid():
    pids = []
    status, log = harness.run_logged(
        [sys.executable, "-c", "import os, time; print(os.getpid()); time.sleep(2.5)"],
        each_second=pids.append,
    )
    assert status == 0 and len(pids) >= 2 and set(pids) == {int(log.split()[0])}
    status, log = harness.run_logged(["sleep", "30"], timeout=1.5, each_second=pids.append)
    assert status == 124 and log.endswith("timed out after 1.5 s: stopped\n")


def test_train_input_keeps_the_shares_over_the_rate_intervals(monkeypatch):
    """`run` with --thread_cpu: the trainer sampled each second, and the row's shares are those
    between the samples inside its progress lines' span."""
    log = "\n".join(
        f"I1129 12:00:{t} 1 loop.py:313] step {s}/6 | learning_rate 0.1 | loss 1.0 | 10.0 img/s"
        " | input wait 0% | launch 1.0 ms a step | ETA 0:00:01"
        for t, s in (("01.500000", 2), ("03.000000", 4), ("05.000000", 6))
    )
    ticks = iter(range(0, 1000, 50))  # the main thread's CPU: 50 ticks a sample, 1 s apart

    def run_logged(cmd, env, timeout, each_second):
        for _ in range(7):
            each_second(4242)
        return 0, log

    def sample(pid, wall):
        second = len(seen)
        seen.append(pid)
        wall = _wall(f"12:00:0{second}.000000")
        return thread_cpu.Sample(pid, wall, {pid: ("x", next(ticks))}, {})

    seen: list[int] = []
    monkeypatch.setattr(harness, "run_logged", run_logged)
    monkeypatch.setattr(thread_cpu, "sample", sample)
    monkeypatch.setattr(thread_cpu, "TICKS_PER_S", 100)
    args = argparse.Namespace(
        thread_cpu=True, child_env={}, timeout_s=10, processes=1, config="c", per_gpu=2,
        steps=6, log_every=2, override=[], data_dir="/d", num_workers=0, launcher="launch_local",
        command_buffer_log=False, gc_log=False,
    )
    row = bench_train_input.run("synthetic", args, 1)
    assert seen == [4242] * 7
    assert row["thread_cpu"] == {"window_s": 3.0, "cpu_s_per_s": {thread_cpu.MAIN: 0.5,
                                                                  thread_cpu.CHILDREN: 0.0}}


def test_train_input_samples_one_process_only():
    with pytest.raises(SystemExit, match="--processes=1"):
        bench_train_input.main(["--thread_cpu", "--processes=2"])
