"""When one process of a multi-process run stops, the others stop with one line saying so.

A process can die without a word (kill -9, the out-of-memory killer, a lost host). The others then
wait in a collective that never finishes: neither gloo (CPU) nor NCCL (GPU) gives up on a silent
peer for many minutes, and JAX's coordination service, once it misses the heartbeats, aborts
every survivor (exit status 134, a C++ check failure and a dump of every thread).

So the processes watch each other over plain TCP, beside JAX: process 0 holds a connection to
every other process (a star, N - 1 sockets), and each end writes a heartbeat line every second. A
connection that closes (the process exited or was killed: its kernel closes the socket at once)
or stays silent for `distributed.heartbeat_timeout_s` (a lost host) is a stopped process; process
0 tells the others which one, and every survivor logs

  process 1 of 2 stopped at step 40; restart the job to resume from step 30

and exits with status 75 (EX_TEMPFAIL, "try again") through `os._exit`: its main thread is
blocked in C++ inside the collective and cannot be woken. JAX's own heartbeat timeout is set
longer (`initialize_kwargs`), so this line comes first.

Why not JAX's recoverable mode (`jax_enable_recoverability`, a thread asking the coordination
service's `get_live_nodes` every second), which this module used before: GPU runs across
emulated hosts (NCCL over sockets between processes) crashed with heap corruption
(`free(): unaligned chunk detected in tcache 2`, segmentation faults) in every run with it on
and in none with it off; `scripts/bench/repro_peer_watch.py` tests the two parts apart on GPUs
(docs/benchmarks.md, "Across hosts"). The watch here calls no JAX function from its thread,
and JAX stays in its default mode.

Not covered: if process 0 dies, JAX's coordination service (which lives there) dies with it,
and JAX may abort the others before their watch reports it.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import select
import socket
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import jax
import orbax.checkpoint as ocp
from absl import logging
from etils import epath
from jax._src import distributed as jax_distributed

# EX_TEMPFAIL: the job failed for a reason outside it; running it again is the fix.
EXIT_STATUS = 75
_POLL_S = 1.0
# After a collective raises (a peer's socket closed), how long past the heartbeat timeout to wait
# for the watch to name the stopped process before letting the exception through.
_VERDICT_GRACE_S = 10.0
# Key under which process 0 publishes its watch address in JAX's key-value store.
_ADDRESS_KEY = "jia_jax/peer_watch_address"
_HEARTBEAT, _DONE, _STOPPED = b"alive", b"done", b"stopped"


def jax_heartbeat_timeout_s(watch_timeout_s: int, watched: bool) -> int:
    """JAX's heartbeat timeout: the watch's own, or long enough past it that the watch speaks first."""
    return 2 * watch_timeout_s + 10 if watched else watch_timeout_s


def initialize_kwargs(heartbeat_timeout_s: int, watched: bool = False) -> dict[str, Any]:
    """The `jax.distributed.initialize` arguments that set JAX's heartbeat timeout, if any.

    `heartbeat_timeout_seconds` exists from jax 0.7 (in 0.10 and 0.11); an older or changed
    signature keeps JAX's default (100 s) and says so.
    """
    if heartbeat_timeout_s < 1:
        raise ValueError(
            f"distributed.heartbeat_timeout_s={heartbeat_timeout_s} must be at least 1 (seconds)."
        )
    if "heartbeat_timeout_seconds" in inspect.signature(jax.distributed.initialize).parameters:
        return {"heartbeat_timeout_seconds": jax_heartbeat_timeout_s(heartbeat_timeout_s, watched)}
    logging.warning(
        "jax %s cannot set the heartbeat timeout: a dead process is noticed after JAX's default.",
        jax.__version__,
    )
    return {}


def newest_checkpoint(directory: epath.PathLike | None) -> int | None:
    """Step of the newest committed checkpoint in `directory`; None if none can be found."""
    if directory is None:
        return None
    try:
        return max(ocp.utils.checkpoint_steps(directory), default=None)
    except OSError:
        return None


def failure_message(
    stopped: list[int], process_count: int, step: int | None, checkpoint: int | None
) -> str:
    """The one line a survivor logs."""
    who = "process" if len(stopped) == 1 else "processes"
    when = "before the first step" if step is None else f"at step {step}"
    restart = (
        "restart the job; it starts again from step 0 (no committed checkpoint found)"
        if checkpoint is None
        else f"restart the job to resume from step {checkpoint}"
    )
    return f"{who} {', '.join(map(str, stopped))} of {process_count} stopped {when}; {restart}"


def connect_star(
    client: Any, index: int, count: int, host: str, timeout_s: float
) -> dict[int, socket.socket]:
    """Process 0's connection to every other process, or this process's to process 0.

    Process 0 listens on every interface and publishes `host:port` in JAX's key-value store
    (`client`, from the main thread, before training); the others read it and connect.

    Returns:
      `{peer index: connected socket}`.
    """
    if index == 0:
        with socket.create_server(("", 0), backlog=max(count, 1)) as server:
            server.settimeout(timeout_s)
            client.key_value_set(_ADDRESS_KEY, f"{host}:{server.getsockname()[1]}")
            links = {}
            while len(links) < count - 1:
                try:
                    conn, _ = server.accept()
                except TimeoutError as e:
                    missing = sorted(set(range(1, count)) - set(links))
                    raise TimeoutError(
                        f"processes {missing} did not join the peer watch within {timeout_s} s "
                        "of the others: see their logs (distributed.watch_peers=false turns the "
                        "watch off)"
                    ) from e
                conn.settimeout(timeout_s)
                links[int(_read_line(conn))] = conn
        return links
    address = client.blocking_key_value_get(_ADDRESS_KEY, int(timeout_s * 1000))
    peer_host, port = address.rsplit(":", 1)
    conn = socket.create_connection((peer_host.strip("[]"), int(port)), timeout=timeout_s)
    conn.sendall(b"%d\n" % index)
    return {0: conn}


def _read_line(conn: socket.socket) -> bytes:
    line = b""
    while not line.endswith(b"\n"):
        chunk = conn.recv(1)
        if not chunk:
            raise ConnectionError("a process closed its watch connection while connecting")
        line += chunk
    return line.strip()


class PeerWatch:
    """Ends this process with one line when another process of the run stops.

    A single-process run (no `links`) watches nothing. The training loop sets `step` to the
    step it has started and runs inside `reporting(checkpoint_dir)`, so that the line names the
    step and the checkpoint a restart resumes from.

    Args:
      links: `{peer index: socket}` from `connect_star`: process 0 holds one to every other
        process, the others one to process 0.
      process_count: Number of processes of the run.
      timeout_s: A peer silent this long has stopped.
    """

    def __init__(
        self,
        links: dict[int, socket.socket] | None = None,
        process_count: int = 1,
        timeout_s: float = 0.0,
    ) -> None:
        self.step: int | None = None
        self._links = dict(links or {})
        self._hub = 0 not in self._links  # process 0 holds the links to everyone else
        self._process_count = process_count
        self._timeout_s = timeout_s
        self._checkpoint_dir: epath.PathLike | None = None
        self._stop = threading.Event()
        self._send_lock = threading.Lock()
        self._thread = threading.Thread(target=self._watch, name="peer-watch", daemon=True)
        if self._links:
            self._thread.start()

    @classmethod
    def of_this_job(cls, timeout_s: float) -> PeerWatch:
        """Watches the processes of the `jax.distributed` job started in this process."""
        state = jax_distributed.global_state
        host = state.coordinator_address.rsplit(":", 1)[0]
        index, count = jax.process_index(), jax.process_count()
        return cls(connect_star(state.client, index, count, host, timeout_s), count, timeout_s)

    @contextlib.contextmanager
    def reporting(self, checkpoint_dir: epath.PathLike) -> Iterator[PeerWatch]:
        """Names the newest checkpoint in `checkpoint_dir` in the line; says goodbye at the end.

        A run that finishes tells its peers so, and is not reported when it disconnects. A
        collective may raise (a peer's socket closed) before the watch has named the peer; the
        exception then waits up to the heartbeat timeout for the one line. A run that fails
        leaves without a goodbye: the others report it and stop instead of waiting for it.
        """
        self._checkpoint_dir = checkpoint_dir
        try:
            yield self
        except jax.errors.JaxRuntimeError:
            if self._thread.is_alive():
                self._thread.join(self._timeout_s + _VERDICT_GRACE_S)
            self._close()
            raise
        except BaseException:
            self._close()
            raise
        self._say_goodbye()

    def _say_goodbye(self) -> None:
        """Tells every peer this process finished, then closes each link only once the peer has.

        Closing a socket with unread data (a peer's heartbeats) makes the kernel send a reset,
        which can reach the peer before the goodbye: it would take this process for stopped. So
        the watch stops first, the goodbye and the end of writing go out, and the link is read
        to its end (the peer closes it on the goodbye) before it is closed.
        """
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        for sock in self._links.values():
            with contextlib.suppress(OSError):
                sock.sendall(_DONE + b"\n")
                sock.shutdown(socket.SHUT_WR)
                sock.settimeout(2 * _POLL_S)
                while sock.recv(4096):
                    pass
            sock.close()

    def _close(self) -> None:
        # The watch thread may be dropping a finished peer's link at this very moment.
        self._stop.set()
        with self._send_lock:
            for sock in self._links.values():
                sock.close()

    def _send_all(self, message: bytes) -> None:
        with self._send_lock:
            for sock in list(self._links.values()):
                with contextlib.suppress(OSError):
                    sock.sendall(message + b"\n")

    def _watch(self) -> None:
        heard = {peer: time.monotonic() for peer in self._links}
        pending = {peer: b"" for peer in self._links}
        while not self._stop.is_set():
            self._send_all(_HEARTBEAT)
            links = dict(self._links)
            try:
                readable, _, _ = select.select(list(links.values()), [], [], _POLL_S)
            except (OSError, ValueError):  # closed by `_close` on the way out
                readable = []
            if self._stop.is_set():
                return
            now = time.monotonic()
            for peer, sock in links.items():
                if sock in readable:
                    try:
                        data = sock.recv(4096)
                    except OSError:
                        data = b""
                    if not data:
                        self._stopped([peer])
                    heard[peer] = now
                    *lines, pending[peer] = (pending[peer] + data).split(b"\n")
                    self._read(peer, lines)
                elif now - heard[peer] > self._timeout_s:
                    self._stopped([peer])

    def _read(self, peer: int, lines: list[bytes]) -> None:
        for line in lines:
            if line == _DONE:
                # Finished: it may disconnect now without being taken for stopped.
                with self._send_lock:
                    self._links.pop(peer).close()
                return
            if line.startswith(_STOPPED):
                self._exit([int(p) for p in line.split()[1:]])

    def _stopped(self, peers: list[int]) -> None:
        if self._hub:
            self._send_all(_STOPPED + b" " + " ".join(map(str, peers)).encode())
        self._exit(peers)

    def _exit(self, stopped: list[int]) -> None:
        message = failure_message(
            stopped, self._process_count, self.step, newest_checkpoint(self._checkpoint_dir)
        )
        logging.error(message)
        sys.stderr.flush()
        os._exit(EXIT_STATUS)
