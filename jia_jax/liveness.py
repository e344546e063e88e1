"""The JAX side of the peer watch (`jia_jax.peer_watch`): timeouts, checkpoint, start-up.

A process can die without a word (kill -9, the out-of-memory killer, a lost host). The others then
wait in a collective that never finishes: neither gloo (CPU) nor NCCL (GPU) gives up on a silent
peer for many minutes, and JAX's coordination service, once it misses the heartbeats, aborts
every survivor (exit status 134, a C++ check failure and a dump of every thread). So the
processes watch each other over plain TCP, beside JAX (`peer_watch.PeerWatch`), and every
survivor logs one line, such as

  process 1 of 2 stopped at step 40; restart the job to resume from step 30

and exits through `os._exit`: its main thread may be blocked in C++ inside the collective and
cannot be woken. JAX's own heartbeat timeout is set longer (`initialize_kwargs`), so this line
comes first.

Why not JAX's recoverable mode (`jax_enable_recoverability`, a thread asking the coordination
service's `get_live_nodes` every second), which this module used before: GPU runs across
emulated hosts (NCCL over sockets between processes) crashed with heap corruption
(`free(): unaligned chunk detected in tcache 2`, segmentation faults) in every run with it on
and in none with it off; neither part alone reproduced it in a collective loop
(docs/benchmarks.md, "Across hosts"). The watch calls no JAX function from its thread, and JAX
stays in its default mode.

Not covered: if process 0 dies, JAX's coordination service (which lives there) dies with it,
and JAX may abort the others before their watch reports it.
"""

from __future__ import annotations

import inspect
from typing import Any

import jax
import orbax.checkpoint as ocp
from absl import logging
from etils import epath
from jax._src import distributed as jax_distributed

from jia_jax import peer_watch


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


# Status codes with which an XLA runtime failure begins its message ("UNKNOWN: Gloo AllGather
# failed: ... Connection closed by peer").
_RUNTIME_STATUS_CODES = frozenset(
    {"UNKNOWN", "INTERNAL", "UNAVAILABLE", "ABORTED", "CANCELLED", "DEADLINE_EXCEEDED", "DATA_LOSS"}
)


def is_runtime_error(error: BaseException) -> bool:
    """Whether `error` is the XLA runtime's, such as a collective whose peer went away.

    Most reach Python as `JaxRuntimeError`; gloo's (CPU collectives) as a `ValueError` whose
    message starts with the status code.
    """
    if isinstance(error, jax.errors.JaxRuntimeError):
        return True
    return isinstance(error, ValueError) and str(error).split(":", 1)[0] in _RUNTIME_STATUS_CODES


def watch_this_job(timeout_s: float) -> peer_watch.PeerWatch:
    """Watches the processes of the `jax.distributed` job started in this process.

    Process 0 listens where the coordinator address says (a name, IPv4, or `[v6]`); a collective
    that fails because a peer went waits for the watch to name the peer.
    """
    state = jax_distributed.global_state
    host = state.coordinator_address.rsplit(":", 1)[0]
    index, count = jax.process_index(), jax.process_count()
    return peer_watch.PeerWatch(
        peer_watch.connect_star(state.client, index, count, host, timeout_s),
        count,
        timeout_s,
        index,
        collective_error=is_runtime_error,
    )
