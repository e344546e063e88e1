"""When one process of a multi-process run dies, the others stop with one line saying so.

A process can die without a word (kill -9, the out-of-memory killer, a lost host). The others then
wait in a collective that never finishes: neither gloo (CPU) nor NCCL (GPU) gives up on a silent
peer for many minutes. JAX's coordination service notices the missing heartbeats after
`distributed.heartbeat_timeout_s`, and by default then aborts every survivor: exit status 134, a
C++ check failure and a dump of every thread. Here the service runs in JAX's recoverable mode,
in which it only marks the silent process dead, and a thread of each process asks it once a
second which processes are alive. When one is missing, that thread logs

  process 1 of 2 stopped sending heartbeats at step 40; restart the job to resume from step 30

and ends the process with status 75 (EX_TEMPFAIL, "try again"), through `os._exit`: the main
thread is blocked in C++ inside the collective and cannot be woken.

The heartbeats stay JAX's own, sent by a C++ thread, so a process holding the GIL through a long
compile or save is not taken for dead; only the reaction to a dead peer changes. jaxlib has a
hook for that reaction, a missed-heartbeat callback, but calling a Python one crashes the client
with std::bad_cast (jaxlib 0.10.2). The price of recoverable mode: JAX no longer holds every
process at a barrier before it disconnects, and process 0, which hosts the service, must leave
last (a process whose service is gone aborts). `PeerWatch.reporting` does both on the way out.

Not covered: if process 0 dies, the service dies with it and JAX aborts the other processes at
once, before this module's thread can run.
"""

from __future__ import annotations

import atexit
import contextlib
import inspect
import os
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
# for the service to name the dead process before letting the exception through.
_VERDICT_GRACE_S = 10.0
# How long a process that finished waits for the others to finish too (JAX's own default).
_FINISH_TIMEOUT_S = 300


def initialize_kwargs(heartbeat_timeout_s: int) -> dict[str, Any]:
    """The `jax.distributed.initialize` arguments that set the heartbeat timeout, if any.

    `heartbeat_timeout_seconds` exists from jax 0.7 (in 0.10 and 0.11); an older or changed
    signature keeps JAX's default (100 s) and says so.
    """
    if heartbeat_timeout_s < 1:
        raise ValueError(
            f"distributed.heartbeat_timeout_s={heartbeat_timeout_s} must be at least 1 (seconds)."
        )
    if "heartbeat_timeout_seconds" in inspect.signature(jax.distributed.initialize).parameters:
        return {"heartbeat_timeout_seconds": int(heartbeat_timeout_s)}
    logging.warning(
        "jax %s cannot set the heartbeat timeout: a dead process is noticed after JAX's default.",
        jax.__version__,
    )
    return {}


def enable_recoverable_service() -> bool:
    """Asks JAX to mark dead processes instead of aborting the others; False if it cannot.

    Only where the client can also answer the watch (live processes, barriers): in recoverable
    mode without a watch, the others would wait for a dead process forever.
    """
    client_type = getattr(getattr(jax_distributed, "_jax", None), "DistributedRuntimeClient", None)
    watchable = all(hasattr(client_type, m) for m in ("get_live_nodes", "wait_at_barrier"))
    try:
        if watchable:
            jax.config.update("jax_enable_recoverability", True)
    except AttributeError:
        watchable = False
    if not watchable:
        logging.warning(
            "jax %s cannot report a dead process itself: if one dies, JAX aborts the others "
            "after distributed.heartbeat_timeout_s instead of a one-line error.",
            jax.__version__,
        )
    return watchable


def newest_checkpoint(directory: epath.PathLike | None) -> int | None:
    """Step of the newest committed checkpoint in `directory`; None if none can be found."""
    if directory is None:
        return None
    try:
        return max(ocp.utils.checkpoint_steps(directory), default=None)
    except OSError:
        return None


def failure_message(
    dead: list[int], process_count: int, step: int | None, checkpoint: int | None
) -> str:
    """The one line a survivor logs."""
    who = "process" if len(dead) == 1 else "processes"
    when = "before the first step" if step is None else f"at step {step}"
    restart = (
        "restart the job; it starts again from step 0 (no committed checkpoint found)"
        if checkpoint is None
        else f"restart the job to resume from step {checkpoint}"
    )
    return (
        f"{who} {', '.join(map(str, dead))} of {process_count} stopped sending heartbeats {when}; "
        + restart
    )


class PeerWatch:
    """Ends this process with one line when another process of the run stops.

    A single-process run (no `client`) watches nothing. The training loop sets `step` to the
    step it has started and runs inside `reporting(checkpoint_dir)`, so that the line names the
    step and the checkpoint a restart resumes from. Each process asks the service once a second
    (one small request, an entry per process in the answer).

    Args:
      client: `jax.distributed`'s client, or None for a single process.
      process_count: Number of processes of the run.
      heartbeat_timeout_s: The timeout given to the coordination service.
    """

    def __init__(
        self, client: Any = None, process_count: int = 1, heartbeat_timeout_s: float = 0.0
    ) -> None:
        self.step: int | None = None
        self._client = client
        self._process_count = process_count
        self._timeout_s = heartbeat_timeout_s
        self._checkpoint_dir: epath.PathLike | None = None
        self._stop = threading.Event()
        self._finished = False
        self._thread = threading.Thread(target=self._watch, name="peer-watch", daemon=True)
        if client is not None:
            self._thread.start()
            # At exit, also after an error: with the others if they come, process 0 last.
            atexit.register(self._leave)

    @classmethod
    def of_this_job(cls, heartbeat_timeout_s: float) -> PeerWatch:
        """Watches the processes of the `jax.distributed` job started in this process."""
        # The client of JAX's coordination service; orbax and jax.experimental.multihost_utils
        # reach it the same way.
        client = jax_distributed.global_state.client
        return cls(client, jax.process_count(), heartbeat_timeout_s)

    @contextlib.contextmanager
    def reporting(self, checkpoint_dir: epath.PathLike) -> Iterator[PeerWatch]:
        """Names the newest checkpoint in `checkpoint_dir` in the line; marks a finished run.

        A collective may raise (a dead peer's socket closed) before the service has declared
        the peer dead; the exception then waits up to the heartbeat timeout for the one line.
        """
        self._checkpoint_dir = checkpoint_dir
        try:
            yield self
        except jax.errors.JaxRuntimeError:
            if self._thread.is_alive():
                self._thread.join(self._timeout_s + _VERDICT_GRACE_S)
            raise
        self._finished = True

    def stop(self) -> None:
        """Stops watching: the thread ends after its current round."""
        self._stop.set()

    def _leave(self) -> None:
        """Meets the others, stops watching, disconnects; process 0 (the service) last.

        A finished run waits long for the others; a failed one only a heartbeat timeout, after
        which it leaves alone and the others report it as dead.
        """
        timeout_s = _FINISH_TIMEOUT_S if self._finished else self._timeout_s
        timeout_ms = int(timeout_s * 1000)
        try:
            # Still watched: a process that dies now is reported like any other.
            self._client.wait_at_barrier("jia_jax/finished", timeout_ms)
            self.stop()
            # Nobody disconnects before every watch has stopped: it would be taken for dead.
            self._client.wait_at_barrier("jia_jax/unwatched", timeout_ms)
        except jax.errors.JaxRuntimeError as e:
            self.stop()
            logging.warning("Not every process finished; leaving without them (%s).", e)
            return
        if jax.process_index() == 0:
            # Answers once every other process has disconnected (see `_watch`).
            self._client.get_live_nodes(list(range(self._process_count)))
        jax.distributed.shutdown()

    def _watch(self) -> None:
        # A round of get_live_nodes is a barrier: it answers once every process still alive has
        # asked. So the rounds of all processes run in step, and a dead process ends the round
        # it is missing from once the service declares it dead.
        everyone = list(range(self._process_count))
        answered = time.monotonic()
        while not self._stop.wait(_POLL_S):
            try:
                live = self._client.get_live_nodes(everyone)
            except jax.errors.JaxRuntimeError:
                # The service lives in process 0: silent for a whole timeout, it is gone.
                if time.monotonic() - answered > self._timeout_s:
                    self._exit([0])
                continue
            answered = time.monotonic()
            dead = sorted(set(everyone) - set(live))
            if dead and not self._stop.is_set():
                self._exit(dead)

    def _exit(self, dead: list[int]) -> None:
        message = failure_message(
            dead, self._process_count, self.step, newest_checkpoint(self._checkpoint_dir)
        )
        logging.error(message)
        sys.stderr.flush()
        os._exit(EXIT_STATUS)
