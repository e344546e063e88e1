"""The peer watch on its own: real processes and sockets, no JAX collectives.

Each child process plays one process of a run: it connects to the others through `connect_star`
(with a key-value store in a file standing in for JAX's), sets a step, and then finishes, fails,
or waits to be told that a peer stopped. What is checked is what a user sees: exit status, the
one line, and how soon it comes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from jia_jax import liveness

REPO_ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 2

_CHILD = textwrap.dedent(
    """
    import os, sys, time
    from absl import logging
    from jia_jax import liveness

    class FileStore:  # JAX's key-value store, as far as connect_star uses it
        def __init__(self, path):
            self.path = path
        def key_value_set(self, key, value):
            with open(self.path + ".tmp", "w") as f:
                f.write(value)
            os.replace(self.path + ".tmp", self.path)
        def blocking_key_value_get(self, key, timeout_ms):
            deadline = time.monotonic() + timeout_ms / 1000
            while not os.path.exists(self.path):
                if time.monotonic() > deadline:
                    raise TimeoutError(key)
                time.sleep(0.01)
            return open(self.path).read()

    logging.set_verbosity(logging.INFO)
    store, index, count, timeout, action = sys.argv[1], *map(int, sys.argv[2:5]), sys.argv[5]
    links = liveness.connect_star(FileStore(store), index, count, "127.0.0.1", timeout)
    watch = liveness.PeerWatch(links, count, timeout)
    with watch.reporting(os.path.dirname(store)):
        watch.step = 5
        print("ready", flush=True)
        if action == "finish":
            time.sleep(0.5 * index)  # finishing at different times is no failure
        elif action == "fail":
            time.sleep(0.5)
            raise RuntimeError("this process failed")
        else:
            time.sleep(60)  # "wait": only the watch ends it
    print("finished", flush=True)
    """
)


def start(tmp_path: Path, actions: list[str]) -> list[subprocess.Popen]:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), JAX_PLATFORMS="cpu")
    store = str(tmp_path / "address")
    return [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD, store, str(i), str(len(actions)), str(TIMEOUT_S), a],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i, a in enumerate(actions)
    ]


def wait_ready(processes: list[subprocess.Popen]) -> None:
    for p in processes:
        assert p.stdout.readline().strip() == "ready", p.stderr.read()


def finish(processes: list[subprocess.Popen], timeout: float) -> list[tuple[int, str]]:
    """Exit status and stderr of each process; fails if one is still running at `timeout`."""
    results = []
    try:
        for p in processes:
            p.wait(timeout=timeout)
            results.append((p.returncode, p.stderr.read()))
    finally:
        for p in processes:
            p.kill()
            p.wait()
    return results


def stopped_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if " stopped " in line]


@pytest.mark.parametrize("victim", [1, 2])
def test_a_killed_process_stops_every_survivor_at_once_with_one_line(tmp_path, victim):
    processes = start(tmp_path, ["wait", "wait", "wait"])
    wait_ready(processes)
    killed_at = time.monotonic()
    processes[victim].send_signal(signal.SIGKILL)
    results = finish(processes, timeout=TIMEOUT_S + 10)
    # A closed socket is noticed at once, long before the heartbeat timeout.
    assert time.monotonic() - killed_at < TIMEOUT_S
    for i, (status, stderr) in enumerate(results):
        if i == victim:
            continue
        assert status == liveness.EXIT_STATUS, stderr
        assert len(stopped_lines(stderr)) == 1, stderr
        assert stopped_lines(stderr)[0].endswith(
            f"process {victim} of 3 stopped at step 5; restart the job; it starts again from "
            "step 0 (no committed checkpoint found)"
        ), stderr


def test_a_silent_process_is_stopped_after_the_heartbeat_timeout(tmp_path):
    processes = start(tmp_path, ["wait", "wait"])
    wait_ready(processes)
    silenced_at = time.monotonic()
    # A frozen process (or a lost host) keeps its socket open but sends nothing.
    processes[1].send_signal(signal.SIGSTOP)
    try:
        [(status, stderr)] = finish(processes[:1], timeout=TIMEOUT_S + 10)
        elapsed = time.monotonic() - silenced_at
    finally:
        processes[1].kill()
        processes[1].wait()
    assert status == liveness.EXIT_STATUS, stderr
    assert "process 1 of 2 stopped at step 5" in stopped_lines(stderr)[0], stderr
    assert TIMEOUT_S - 1 <= elapsed <= TIMEOUT_S + 3 * liveness._POLL_S


def test_processes_finishing_at_different_times_are_not_taken_for_stopped(tmp_path):
    # Process 0 (which every other one connects to) finishes first, process 2 last.
    results = finish(start(tmp_path, ["finish", "finish", "finish"]), timeout=20)
    for status, stderr in results:
        assert status == 0, stderr
        assert not stopped_lines(stderr), stderr


def test_a_process_that_fails_is_reported_by_the_others(tmp_path):
    processes = start(tmp_path, ["wait", "fail", "wait"])
    wait_ready(processes)
    results = finish(processes, timeout=TIMEOUT_S + 10)
    status, stderr = results[1]
    assert status != 0 and "this process failed" in stderr
    for status, stderr in (results[0], results[2]):
        assert status == liveness.EXIT_STATUS, stderr
        assert "process 1 of 3 stopped at step 5" in stopped_lines(stderr)[0], stderr


def test_a_process_that_never_joins_the_watch_is_named(tmp_path):
    class NoStore:
        def key_value_set(self, key, value):
            pass

    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"processes \[1, 2\] did not join the peer watch"):
        liveness.connect_star(NoStore(), 0, 3, "127.0.0.1", 0.5)
    assert time.monotonic() - start < 5
