"""The peer watch on its own: real processes and sockets, no JAX.

Each child process plays one process of a run: it connects to the others through `connect_star`
(with a key-value store in a file standing in for JAX's), sets a step, waits for the test's "go",
and then finishes, fails, or waits to be told that a peer stopped or failed. What is checked is
what a user sees: exit status, the one line, and how soon it comes. `jia_jax.peer_watch` imports
no JAX: a child loads it alone and starts in a fraction of a second.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from jia_jax import peer_watch
from tests import mp_util

REPO_ROOT = Path(__file__).resolve().parents[1]
# Short, and safe on a busy machine: the children's main threads only sleep, so nothing keeps the
# watch's thread from Python's lock (a main thread tracing a step can, hence longer timeouts in
# tests/test_multiprocess.py).
TIMEOUT_S = 2

# The package's __init__ imports JAX (`from jia_jax import lars`); the watch's module does not,
# and loaded alone it starts a child in a fraction of a second instead of one or two on a busy
# machine. Process 0 waits up to CONNECT_S for the others to connect.
_PREAMBLE = f"""
import importlib.util, os, sys, time

_spec = importlib.util.spec_from_file_location(
    "peer_watch", {str(REPO_ROOT / "jia_jax" / "peer_watch.py")!r}
)
peer_watch = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(peer_watch)
assert "jax" not in sys.modules  # the watch thread cannot call into JAX
CONNECT_S = 60
"""

_STORE = _PREAMBLE + """

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
"""

# argv: store, index, count, timeout, action[:seconds]. "finish:S" finishes after S seconds,
# "fail:S" raises after S seconds, "wait" waits for the watch to end it.
_CHILD = _STORE + textwrap.dedent(
    """
    from absl import logging

    logging.set_verbosity(logging.INFO)
    store, index, count, timeout = sys.argv[1], *map(int, sys.argv[2:5])
    action, _, seconds = sys.argv[5].partition(":")
    links = peer_watch.connect_star(FileStore(store), index, count, "127.0.0.1", CONNECT_S)
    watch = peer_watch.PeerWatch(links, count, timeout, index)
    with watch.reporting():
        watch.step = 5
        print("ready", flush=True)
        sys.stdin.readline()  # "go", once every process is ready
        if action == "finish":
            time.sleep(float(seconds))
        elif action == "fail":
            time.sleep(float(seconds))
            raise RuntimeError("the same error on every process")
        else:
            time.sleep(120)  # only the watch ends it
    print("finished", flush=True)
    """
)


def start(tmp_path: Path, actions: list[str]) -> list[subprocess.Popen]:
    """One process per action; returns once all are connected and told to go."""
    tmp_path.mkdir(exist_ok=True)
    store = str(tmp_path / "address")
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD, store, str(i), str(len(actions)), str(TIMEOUT_S), a],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i, a in enumerate(actions)
    ]
    for p in processes:
        assert p.stdout.readline().strip() == "ready", p.stderr.read()
    for p in processes:
        p.stdin.write("go\n")
        p.stdin.flush()
    return processes


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


def watch_lines(stderr: str) -> list[str]:
    """The lines in which the watch names a peer that stopped or failed."""
    return [line for line in stderr.splitlines() if " stopped " in line or " failed " in line]


def assert_the_others_say(results: list[tuple[int, str]], process: int, status: int, line: str):
    """Every process but `process` exited with `status` and one watch line, ending in `line`."""
    for i, (got, stderr) in enumerate(results):
        if i != process:
            assert got == status, stderr
            assert len(watch_lines(stderr)) == 1, stderr
            assert watch_lines(stderr)[0].endswith(line), stderr


@pytest.mark.parametrize("victim", [1, 2])
def test_a_killed_process_stops_every_survivor_at_once_with_one_line(tmp_path, victim):
    processes = start(tmp_path, ["wait", "wait", "wait"])
    killed_at = time.monotonic()
    processes[victim].send_signal(signal.SIGKILL)
    results = finish(processes, timeout=TIMEOUT_S + 10)
    # A closed socket is noticed at once, long before the heartbeat timeout.
    assert time.monotonic() - killed_at < TIMEOUT_S
    assert_the_others_say(
        results,
        victim,
        peer_watch.EXIT_STATUS,
        f"process {victim} of 3 stopped at step 5; restart the job; it starts again from "
        "step 0 (no committed checkpoint found)",
    )


def test_a_silent_process_is_stopped_after_the_heartbeat_timeout(tmp_path):
    processes = start(tmp_path, ["wait", "wait"])
    silenced_at = time.monotonic()
    # A frozen process (or a lost host) keeps its socket open but sends nothing.
    processes[1].send_signal(signal.SIGSTOP)
    try:
        [(status, stderr)] = finish(processes[:1], timeout=TIMEOUT_S + 10)
        elapsed = time.monotonic() - silenced_at
    finally:
        processes[1].kill()
        processes[1].wait()
    assert status == peer_watch.EXIT_STATUS, stderr
    assert "process 1 of 2 stopped at step 5" in watch_lines(stderr)[0], stderr
    assert TIMEOUT_S - 1 <= elapsed <= TIMEOUT_S + 3 * peer_watch.HEARTBEAT_INTERVAL_S


def test_processes_finishing_at_different_times_are_not_taken_for_stopped(tmp_path):
    # Process 0 (which every other one connects to) finishes first, process 2 last.
    results = finish(start(tmp_path, ["finish:0", "finish:0.5", "finish:1"]), timeout=20)
    for status, stderr in results:
        assert status == 0, stderr
        assert not watch_lines(stderr), stderr


def test_healthy_processes_run_well_past_the_heartbeat_timeout(tmp_path):
    # Each heartbeat that arrives renews the peer: three timeouts of heartbeats, no verdict.
    results = finish(start(tmp_path, ["finish:6", "finish:6"]), timeout=30)
    for status, stderr in results:
        assert status == 0, stderr
        assert not watch_lines(stderr), stderr


@pytest.mark.parametrize("failing", [0, 1])
def test_a_process_that_fails_is_named_as_failed_by_the_others(tmp_path, failing):
    actions = ["wait"] * 3
    actions[failing] = "fail:0.2"
    results = finish(start(tmp_path, actions), timeout=3 * TIMEOUT_S + 20)
    status, stderr = results[failing]
    assert status == peer_watch.FAILED_STATUS, stderr
    assert stderr.rstrip().endswith("RuntimeError: the same error on every process"), stderr
    assert not watch_lines(stderr), stderr
    # Running again would fail again: not the "restart" status.
    assert_the_others_say(
        results,
        failing,
        peer_watch.FAILED_STATUS,
        f"process {failing} of 3 failed at step 5: RuntimeError: the same error on every process",
    )


def test_processes_failing_alike_each_report_their_own_error(tmp_path):
    # Diverging together: every process raises the same error, one 0.3 s after the other (each
    # order in turn), well within the heartbeat timeout. Each must end with its own error: not a
    # peer's, not "stopped" (75), not killed by a signal.
    for repetition in range(20):
        delays = ["fail:0", "fail:0.3"][:: 1 if repetition % 2 else -1]
        results = finish(start(tmp_path / str(repetition), delays), timeout=3 * TIMEOUT_S + 20)
        for status, stderr in results:
            assert status == peer_watch.FAILED_STATUS, (repetition, stderr)
            assert stderr.rstrip().endswith("RuntimeError: the same error on every process")
            assert not watch_lines(stderr), (repetition, stderr)


_IDLE_PAIR = _PREAMBLE + textwrap.dedent(
    """
    import select, socket, threading

    # Two watches joined through a relay that counts the heartbeats each way.
    hub_end, hub_relay = socket.socketpair()
    peer_end, peer_relay = socket.socketpair()
    beats = {hub_relay: 0, peer_relay: 0}
    other = {hub_relay: peer_relay, peer_relay: hub_relay}

    def relay():
        open_ends = list(beats)
        while open_ends:
            for sock in select.select(open_ends, [], [])[0]:
                data = sock.recv(65536)
                if not data:  # pass the end of writing on, as a real link would
                    other[sock].shutdown(socket.SHUT_WR)
                    open_ends.remove(sock)
                    continue
                beats[sock] += data.count(b"alive")
                other[sock].sendall(data)

    threading.Thread(target=relay, daemon=True).start()
    seconds = float(sys.argv[1])
    hub = peer_watch.PeerWatch({1: hub_end}, 2, 30.0, 0)
    peer = peer_watch.PeerWatch({0: peer_end}, 2, 30.0, 1)
    with hub.reporting(), peer.reporting():
        time.sleep(seconds)
        print(beats[hub_relay] / seconds, beats[peer_relay] / seconds, flush=True)
    """
)


def test_idle_watches_send_a_heartbeat_a_second(tmp_path):
    # Each heartbeat used to answer the other's: ~20,000 a second each way, a busy core.
    seconds = 3.0
    result = subprocess.run(
        [sys.executable, "-c", _IDLE_PAIR, str(seconds)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    rates = [float(r) for r in result.stdout.split()]
    # One per HEARTBEAT_INTERVAL_S each way (the first at once): at most 3 a second.
    assert len(rates) == 2 and all(0 < r <= 3 for r in rates), rates


def test_a_process_that_never_joins_the_watch_is_named(tmp_path):
    class NoStore:
        def key_value_set(self, key, value):
            pass

    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"processes \[1, 2\] did not join the peer watch"):
        peer_watch.connect_star(NoStore(), 0, 3, "127.0.0.1", 0.5)
    assert time.monotonic() - start < 5



class DictStore:
    def __init__(self):
        self.values, self.ready = {}, threading.Event()

    def key_value_set(self, key, value):
        self.values[key] = value
        self.ready.set()

    def blocking_key_value_get(self, key, timeout_ms):
        assert self.ready.wait(timeout_ms / 1000)
        return self.values[key]


@pytest.mark.parametrize("dual_stack", [True, False], ids=["dual_stack", "one_family"])
@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "[::1]"])
def test_the_watch_connects_over_ipv4_ipv6_and_names(monkeypatch, host, dual_stack):
    """Process 0 listens where a coordinator address of each form reaches it."""
    if host == "[::1]" and not mp_util.has_ipv6_loopback():
        pytest.skip("this machine has no IPv6 loopback")
    if not dual_stack:  # a kernel without dual-stack sockets: the family `host` resolves to
        monkeypatch.setattr(socket, "has_dualstack_ipv6", lambda: False)
    store, links = DictStore(), {}
    hub = threading.Thread(
        target=lambda: links.update(peer_watch.connect_star(store, 0, 2, host, 5.0))
    )
    hub.start()
    [(peer, conn)] = peer_watch.connect_star(store, 1, 2, host, 5.0).items()
    hub.join()
    with conn, links[1]:
        assert peer == 0 and store.values[peer_watch._ADDRESS_KEY].startswith(f"{host}:")
        conn.sendall(b"over the link\n")
        assert links[1].recv(100) == b"over the link\n"
