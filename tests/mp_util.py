"""Runs a Python snippet in several local processes joined by `jax.distributed` (CPU, gloo).

Each process sees `local_devices` simulated CPU devices, so 2 processes x 4 devices give the same
8-device global view as a 2-node cluster, with the "node" mesh axis being the process.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Mapping
from pathlib import Path

from jia_jax.process_per_gpu import free_port  # the coordinator's port, as main picks it

REPO_ROOT = Path(__file__).resolve().parents[1]

# Prepended to the snippet unless `initialize=False`. The snippet can read the same environment
# variables (e.g. to pass them to the trainer's own initialization) or call jax.process_index().
_PREAMBLE = """\
import os
import jax
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(
    coordinator_address=os.environ["MP_COORDINATOR_ADDRESS"],
    num_processes=int(os.environ["MP_NUM_PROCESSES"]),
    process_id=int(os.environ["MP_PROCESS_ID"]),
)
"""


def has_ipv6_loopback() -> bool:
    """Whether this machine can listen on ::1."""
    try:
        with socket.create_server(("::1", 0), family=socket.AF_INET6):
            return True
    except OSError:
        return False


def _child_env(
    process_id: int,
    num_processes: int,
    local_devices: int,
    address: str,
    extra: Mapping[str, str] | None,
) -> dict[str, str]:
    env = dict(os.environ)
    # The parent test process was started with 8 devices; each child must see only its own.
    flags = [
        f
        for f in env.get("XLA_FLAGS", "").split()
        if not f.startswith("--xla_force_host_platform_device_count")
    ]
    flags.append(f"--xla_force_host_platform_device_count={local_devices}")
    env["XLA_FLAGS"] = " ".join(flags)
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env["MP_COORDINATOR_ADDRESS"] = address
    env["MP_NUM_PROCESSES"] = str(num_processes)
    env["MP_PROCESS_ID"] = str(process_id)
    env.update(extra or {})
    return env


def _tail(path: Path, chars: int = 3000) -> str:
    return path.read_text(errors="replace")[-chars:]


def _start(
    script: str,
    tmp_dir: Path,
    num_processes: int,
    local_devices: int,
    initialize: bool,
    env: Mapping[str, str] | None,
    address: str | None,
) -> tuple[list[subprocess.Popen], list[Path], list[Path]]:
    """Starts the processes; returns them and the files of their stdout and stderr."""
    source = (_PREAMBLE if initialize else "") + textwrap.dedent(script)
    address = address or f"127.0.0.1:{free_port()}"
    script_path = tmp_dir / "snippet.py"
    script_path.write_text(source)
    outs = [tmp_dir / f"stdout_{i}.txt" for i in range(num_processes)]
    errs = [tmp_dir / f"stderr_{i}.txt" for i in range(num_processes)]
    procs = []
    for i in range(num_processes):
        # Files, not pipes: a chatty process cannot block on a full pipe while we wait on another.
        with outs[i].open("wb") as out, errs[i].open("wb") as err:
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(script_path)],
                    cwd=REPO_ROOT,
                    stdout=out,
                    stderr=err,
                    env=_child_env(i, num_processes, local_devices, address, env),
                )
            )
    return procs, outs, errs


def run_multiprocess(
    script: str,
    num_processes: int = 2,
    local_devices: int = 4,
    timeout: float = 180.0,
    *,
    initialize: bool = True,
    env: Mapping[str, str] | None = None,
) -> list[str]:
    """Runs `script` in `num_processes` Python processes and returns their stdouts.

    Every process gets `MP_PROCESS_ID`, `MP_NUM_PROCESSES` and `MP_COORDINATOR_ADDRESS`
    ("127.0.0.1:<free port>") in its environment, `local_devices` CPU devices, JAX_PLATFORMS=cpu,
    the repository root on PYTHONPATH and the repository root as working directory.

    Args:
      script: Python source (dedented automatically).
      num_processes: Number of processes.
      local_devices: Simulated CPU devices per process.
      timeout: Seconds for all processes together.
      initialize: Prepend gloo collectives + `jax.distributed.initialize` from the variables above;
        pass False when the snippet initializes by itself (e.g. through the trainer).
      env: Extra environment variables for every process.

    Returns:
      The stdout of each process, indexed by process id.

    Raises:
      RuntimeError: A process exited with a non-zero status, or the timeout passed; the message holds
        every process's exit status and stderr tail.
    """
    with tempfile.TemporaryDirectory(prefix="mp_util_") as tmp:
        procs, outs, errs = _start(
            script, Path(tmp), num_processes, local_devices, initialize, env, None
        )
        deadline = time.monotonic() + timeout
        failure = None
        while failure is None and any(p.poll() is None for p in procs):
            if any(p.returncode not in (None, 0) for p in procs):
                failure = (
                    "a process failed"  # The others would wait for it in a collective forever.
                )
            elif time.monotonic() > deadline:
                failure = f"timed out after {timeout:.0f} s"
            else:
                time.sleep(0.1)
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        if failure is None and any(p.returncode != 0 for p in procs):
            failure = "a process failed"
        if failure is not None:
            report = "\n".join(
                f"--- process {i} (exit status {p.returncode}) stderr tail:\n{_tail(errs[i])}"
                for i, p in enumerate(procs)
            )
            raise RuntimeError(f"run_multiprocess: {failure}.\n{report}")
        return [o.read_text() for o in outs]


def run_to_exit(
    script: str,
    num_processes: int = 2,
    local_devices: int = 1,
    timeout: float = 180.0,
    *,
    initialize: bool = True,
    env: Mapping[str, str] | None = None,
    address: str | None = None,
) -> list[tuple[int, str]]:
    """Runs `script` as `run_multiprocess` does, but lets every process end by itself.

    Args:
      address: The coordinator address (default "127.0.0.1:<free port>").

    Returns:
      The exit status (negative: killed by that signal) and stderr of each process.

    Raises:
      subprocess.TimeoutExpired: A process still ran at `timeout` (all are killed).
    """
    with tempfile.TemporaryDirectory(prefix="mp_util_") as tmp:
        procs, _, errs = _start(
            script, Path(tmp), num_processes, local_devices, initialize, env, address
        )
        deadline = time.monotonic() + timeout
        try:
            for p in procs:
                p.wait(timeout=max(deadline - time.monotonic(), 0.0))
        finally:
            for p in procs:
                p.kill()
                p.wait()
        return [(p.returncode, e.read_text(errors="replace")) for p, e in zip(procs, errs)]
