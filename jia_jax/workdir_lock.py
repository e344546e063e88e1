"""One training run per workdir: a second run started on a workdir another one is training in
stops with one line naming the first, before it touches the first run's checkpoints.

Two runs writing one workdir would each delete the other's checkpoints past `checkpoint_keep`
and interleave their TensorBoard logs. The first process of a run holds an exclusive advisory
lock (`fcntl.flock`) on ``<workdir>/.jia_jax.lock`` for as long as it trains; the kernel drops
it when the process ends, however it ends, so a killed run leaves nothing to clean up. Evaluating
or exporting a checkpoint takes no lock: those read a workdir while it trains.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
from collections.abc import Iterator

from absl import logging

LOCK_NAME = ".jia_jax.lock"


class WorkdirInUseError(OSError):
    """Another training run holds the workdir's lock."""


def cannot_create(workdir: str, path: str, error: OSError) -> OSError:
    """The one-line error for `path` under --workdir that the system refused to create."""
    return OSError(
        f"--workdir={workdir}: cannot create {path} ({error.strerror or error}); give a "
        "directory you can write to (it is created if missing)."
    )


@contextlib.contextmanager
def held(workdir: str, primary: bool = True) -> Iterator[None]:
    """Holds `workdir`'s lock while the block runs (creating the directory if missing); only
    where `primary` (the run's first process: the others share its lock).

    Raises:
      WorkdirInUseError: naming the run that holds it (host, process id, since when).
      OSError: naming --workdir and the system's reason, if the lock file cannot be created.
    """
    if not primary:
        yield
        return
    path = os.path.join(workdir, LOCK_NAME)
    try:
        os.makedirs(workdir, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as error:
        raise cannot_create(workdir, path, error) from error
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 512).decode(errors="replace").strip() or "a process"
            raise WorkdirInUseError(
                f"--workdir={workdir} is in use by another training run ({holder}): stop that "
                "run, or give this one another --workdir."
            ) from None
        except OSError as error:  # a filesystem without locks (ENOLCK, EOPNOTSUPP)
            logging.warning(
                "--workdir=%s cannot be locked (%s): nothing stops a second run from writing "
                "into it.", workdir, error.strerror or error,
            )
        else:
            os.ftruncate(fd, 0)
            since = time.strftime("%Y-%m-%d %H:%M:%S %Z")
            os.write(fd, f"process {os.getpid()} on {socket.gethostname()}, since {since}\n"
                     .encode())
        yield
    finally:
        os.close(fd)  # drops the lock
