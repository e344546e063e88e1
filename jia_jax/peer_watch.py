"""The processes of a run watch each other over TCP, and each one leaves with a line that is true.

Process 0 (the hub) holds a connection to every other process, the others one to process 0 (a
star, N - 1 sockets). Each end writes one line per message:

  alive                every `HEARTBEAT_INTERVAL_S`, whatever arrives in between
  done                 the process finished; its link may close
  failed K LINE        process K raised LINE, its own error (the hub passes it on to the others)
  stopped K [K ...]    from the hub: those processes vanished

A process ends with the first of these that concerns it:
- its own error: the error's line, exit status 1;
- a peer's error: `process K of N failed at step S: LINE`, status 1 (running again will not help);
- a peer that vanished (its link closed without a word, or silent for `timeout_s`):
  `process K of N stopped at step S; restart the job ...`, status 75 (EX_TEMPFAIL, try again).
A peer's error becomes this process's line after `timeout_s` without an error of its own, or at
once when a collective fails for want of that peer: processes that diverge together each report
their own error.

A process that fails leaves through `os._exit`, never through JAX's exit-time shutdown (a barrier
that waits for every process, some of which have already gone the same way), and process 0, where
JAX's coordination service lives, leaves last: a process still running when the service goes is
aborted by JAX with a C++ fatal message and a dump of every thread. Process 0 ends writing on each
link and reads it to its end, which comes when that process has exited; the others read their link
to its end (process 0 ending it) before they exit.

This module uses no JAX (`jia_jax.liveness` starts the watch of a `jax.distributed` job), so the
watch thread never calls into JAX.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import select
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from absl import logging

# EX_TEMPFAIL: the job failed for a reason outside it; running it again is the fix.
EXIT_STATUS = 75
FAILED_STATUS = 1
HEARTBEAT_INTERVAL_S = 1.0
# After a collective raises (a peer's socket closed), how long past the heartbeat timeout to wait
# for the watch to name the peer before taking the exception for this process's own error.
_VERDICT_GRACE_S = 10.0
# Key under which process 0 publishes its watch address in the job's key-value store.
_ADDRESS_KEY = "jia_jax/peer_watch_address"
_HEARTBEAT, _DONE, _FAILED, _STOPPED = b"alive", b"done", b"failed", b"stopped"


def _when(step: int | None) -> str:
    return "before the first step" if step is None else f"at step {step}"


def stopped_message(
    stopped: list[int], process_count: int, step: int | None, checkpoint: int | None
) -> str:
    """The line of a process whose peers vanished."""
    who = "process" if len(stopped) == 1 else "processes"
    restart = (
        "restart the job; it starts again from step 0 (no committed checkpoint found)"
        if checkpoint is None
        else f"restart the job to resume from step {checkpoint}"
    )
    processes = ", ".join(map(str, stopped))
    return f"{who} {processes} of {process_count} stopped {_when(step)}; {restart}"


def failed_message(process: int, process_count: int, step: int | None, error: str) -> str:
    """The line of a process whose peer raised `error` (that process's own line)."""
    return f"process {process} of {process_count} failed {_when(step)}: {error}"


def one_line(error: BaseException) -> str:
    """``Type: message`` on one line, as a failed process tells its peers."""
    return " ".join(f"{type(error).__name__}: {error}".split())


def _listen(host: str, backlog: int) -> socket.socket:
    """A server on every address of both IP families, or, where the kernel has no dual-stack
    sockets, of the family `host` (the coordinator's name or address) resolves to first."""
    if socket.has_dualstack_ipv6():
        return socket.create_server(
            ("", 0), family=socket.AF_INET6, backlog=backlog, dualstack_ipv6=True
        )
    family = socket.getaddrinfo(host.strip("[]"), None, type=socket.SOCK_STREAM)[0][0]
    return socket.create_server(("", 0), family=family, backlog=backlog)


def connect_star(
    client: Any, index: int, count: int, host: str, timeout_s: float
) -> dict[int, socket.socket]:
    """Process 0's connection to every other process, or this process's to process 0.

    Process 0 listens on every interface and publishes `host:port` in the job's key-value store
    (`client`, JAX's from the main thread before training); the others read it and connect.

    Args:
      client: `key_value_set(key, value)` and `blocking_key_value_get(key, timeout_ms)`.
      index: This process's index.
      count: Number of processes.
      host: Process 0's host as the coordinator address names it: a name, an IPv4 address or
        a bracketed IPv6 one (`[::1]`).
      timeout_s: How long to wait for the others.

    Returns:
      `{peer index: connected socket}`.
    """
    if index == 0:
        with _listen(host, max(count, 1)) as server:
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


def _recv(sock: socket.socket) -> bytes:
    """What the peer sent; b"" once its end is closed (or reset)."""
    try:
        return sock.recv(4096)
    except OSError:
        return b""


def _read_to_end(links: list[socket.socket], timeout_s: float) -> None:
    """Reads and drops what arrives on `links` until each is closed by its far end, or timeout."""
    deadline = time.monotonic() + timeout_s
    open_links = list(links)
    while open_links and (left := deadline - time.monotonic()) > 0:
        readable, _, _ = select.select(open_links, [], [], left)
        open_links = [s for s in open_links if s not in readable or _recv(s)]


def _flush_logs() -> None:
    logging.flush()
    sys.stdout.flush()
    sys.stderr.flush()


class _Verdict(NamedTuple):
    """Why this process ends: `peers` vanished (no `error`), or `peers[0]` raised `error`."""

    peers: tuple[int, ...]
    error: str | None = None


class PeerWatch:
    """Ends this process with one true line when another process of the run stops or fails.

    A single-process run (no `links`) watches nothing. The training loop sets `step` to the
    step it has started and runs inside `reporting`.

    Args:
      links: `{peer index: socket}` from `connect_star`.
      process_count: Number of processes of the run.
      timeout_s: A peer silent this long has stopped; also how long a peer's failure waits for
        this process's own error before it becomes this process's line.
      index: This process's index.
      collective_error: Whether an exception may be a collective's that failed because a peer
        went: the watch names the peer instead, if it can within `timeout_s` and a grace.
    """

    def __init__(
        self,
        links: dict[int, socket.socket] | None = None,
        process_count: int = 1,
        timeout_s: float = 0.0,
        index: int = 0,
        collective_error: Callable[[BaseException], bool] = lambda error: False,
    ) -> None:
        self.step: int | None = None
        self._links = dict(links or {})
        self._process_count = process_count
        self._timeout_s = timeout_s
        self._index = index
        self._collective_error = collective_error
        self._resume_step: Callable[[], int | None] = lambda: None
        # Guards `_links` (the watch drops a finished peer's) and `_decided`: whichever thread
        # decides first how this process ends carries it out.
        self._lock = threading.Lock()
        self._decided = False
        self._main_decided = threading.Event()
        self._verdict: _Verdict | None = None
        self._verdict_ready = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="peer-watch", daemon=True)
        if self._links:
            # Written to on stop, so that the watch's wait returns at once.
            self._wake, self._waker = socket.socketpair()
            self._thread.start()

    @property
    def _hub(self) -> bool:
        return self._index == 0

    @contextlib.contextmanager
    def reporting(
        self, resume_step: Callable[[], int | None] = lambda: None
    ) -> Iterator[PeerWatch]:
        """Runs the body as this process's part of the run, and ends it as `PeerWatch` says.

        Args:
          resume_step: The step a restart resumes from (the newest committed checkpoint), or
            None; named in the line when a peer stops.

        A body that finishes says goodbye: its peers do not report it. One that raises tells its
        peers, and the process leaves at interpreter exit in the order that spares JAX's
        coordination service. A `collective_error` first waits for the watch's verdict on the
        peers, and ends the process with that line if one comes.
        """
        self._resume_step = resume_step
        try:
            yield self
        except BaseException as error:
            if self._links:
                if self._collective_error(error):
                    self._leave_if_told(self._timeout_s + _VERDICT_GRACE_S)
                self._fail(error)
            raise
        if self._links:
            self._say_goodbye()

    def _decide(self) -> bool:
        """True for the first thread to ask: it is the one that ends this process."""
        with self._lock:
            decided, self._decided = self._decided, True
        return not decided

    def _take_over(self) -> None:
        """Makes the main thread the one that ends this process, and stops the watch."""
        if not self._decide():
            self._thread.join()  # the watch is ending the process: it exits, never to return
        self._main_decided.set()
        self._stop.set()
        self._waker.send(b"x")
        self._thread.join()

    def _leave_if_told(self, wait_s: float) -> None:
        if self._verdict_ready.wait(wait_s):
            self._take_over()
            self._leave(self._verdict)

    def _fail(self, error: BaseException) -> None:
        """Tells the peers this process failed; it leaves at exit, after its own line."""
        self._take_over()
        self._send_all(b"%s %d %s" % (_FAILED, self._index, one_line(error).encode()))
        # Registered after JAX's exit-time shutdown, so it runs first and skips it.
        atexit.register(self._exit, FAILED_STATUS)

    def _say_goodbye(self) -> None:
        """Tells every peer this process finished, then closes each link once the peer has.

        Closing a socket with unread data (a peer's heartbeats) makes the kernel send a reset,
        which can reach the peer before the goodbye: it would take this process for stopped. So
        the goodbye and the end of writing go out, and each link is read to its end (the peer
        closes it on the goodbye) before it is closed.
        """
        self._take_over()
        links = list(self._links.values())
        for sock in links:
            with contextlib.suppress(OSError):
                sock.sendall(_DONE + b"\n")
                sock.shutdown(socket.SHUT_WR)
        _read_to_end(links, self._timeout_s)
        for sock in (*links, self._wake, self._waker):
            sock.close()

    def _send_all(self, message: bytes, skip: int | None = None) -> None:
        with self._lock:
            for peer, sock in self._links.items():
                if peer != skip:
                    with contextlib.suppress(OSError):
                        sock.sendall(message + b"\n")

    def _watch(self) -> None:
        verdict = self._listen()
        if verdict is None:
            return
        self._verdict = verdict
        self._verdict_ready.set()
        # A failed peer: this process may be failing the same way a moment later, and then its
        # own error is its line. A main thread blocked in a collective never gets there.
        if verdict.error is not None and self._main_decided.wait(self._timeout_s):
            return
        if self._decide():
            self._leave(verdict)

    def _listen(self) -> _Verdict | None:
        """Heartbeats until a peer stops or fails (its verdict), or until stopped (None)."""
        heard = dict.fromkeys(self._links, time.monotonic())
        pending = dict.fromkeys(self._links, b"")
        next_beat = time.monotonic()
        while True:
            now = time.monotonic()
            if now >= next_beat:
                self._send_all(_HEARTBEAT)
                next_beat = now + HEARTBEAT_INTERVAL_S
            with self._lock:
                links = dict(self._links)
            readable, _, _ = select.select([self._wake, *links.values()], [], [], next_beat - now)
            if self._stop.is_set():
                return None
            now = time.monotonic()
            for peer, sock in links.items():
                if sock in readable:
                    data = _recv(sock)
                    if not data:
                        return _Verdict((peer,))
                    heard[peer] = now
                    *lines, pending[peer] = (pending[peer] + data).split(b"\n")
                    if verdict := self._read(peer, lines):
                        return verdict
                elif now - heard[peer] > self._timeout_s:
                    return _Verdict((peer,))

    def _read(self, peer: int, lines: list[bytes]) -> _Verdict | None:
        for line in lines:
            kind, _, rest = line.partition(b" ")
            if kind == _DONE:
                # Finished: it may disconnect now without being taken for stopped.
                with self._lock:
                    self._links.pop(peer).close()
                return None
            if kind == _FAILED:
                failed, _, error = rest.partition(b" ")
                if self._hub:
                    self._send_all(line, skip=peer)
                    with contextlib.suppress(OSError):
                        self._links[peer].shutdown(socket.SHUT_WR)  # it may exit now
                return _Verdict((int(failed),), error.decode(errors="replace"))
            if kind == _STOPPED:
                return _Verdict(tuple(int(p) for p in rest.split()))
        return None

    def _leave(self, verdict: _Verdict) -> None:
        """Logs this process's line and exits with its status, in the order that spares JAX."""
        if verdict.error is None:
            with self._lock:  # gone: nothing to wait for
                for peer in verdict.peers:
                    if peer in self._links:
                        self._links.pop(peer).close()
            if self._hub:
                self._send_all(b"%s %s" % (_STOPPED, b" ".join(b"%d" % p for p in verdict.peers)))
            line = stopped_message(
                list(verdict.peers), self._process_count, self.step, self._resume_step()
            )
            status = EXIT_STATUS
        else:
            line = failed_message(verdict.peers[0], self._process_count, self.step, verdict.error)
            status = FAILED_STATUS
        logging.error(line)
        self._exit(status)

    def _exit(self, status: int) -> None:
        """Leaves after every other process (process 0) or once process 0 lets go (the others)."""
        _flush_logs()
        with self._lock:
            links = list(self._links.values())
        if self._hub:
            for sock in links:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_WR)
        _read_to_end(links, self._timeout_s + _VERDICT_GRACE_S)
        os._exit(status)
