"""Processes as emulated hosts: one machine's GPUs split into hosts that NCCL joins by sockets.

What `scripts/launch_local.sh --hosts` does for the trainer, for benchmarks that start their own
processes (`link`, `overlap`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable

from jia_jax import process_per_gpu
from scripts.bench import harness

# NCCL's socket transport on loopback, as `scripts/launch_local.sh --hosts` sets it.
LOOPBACK_NETWORK = {"NCCL_SOCKET_IFNAME": "lo", "NCCL_NET": "Socket", "NCCL_IB_DISABLE": "1"}


def run(
    module_args: Callable[[int, int], list[str]],
    hosts: int,
    gpus_per_host: int,
    nccl: dict[str, str],
    timeout: float,
    separate: bool = True,
) -> tuple[list[int | None], list[str]]:
    """Runs `python -m <module_args(process, port)>` once per emulated host; waits for them all.

    Process i sees GPUs i*G .. i*G+G-1 and, with `separate`, its own `NCCL_HOSTID` (a host of
    its own to NCCL: sockets between the processes, NVLink inside each); `port` is a free one for
    the processes' `jax.distributed` coordinator. The caller's `NCCL_*` settings are replaced by
    `LOOPBACK_NETWORK` and `nccl`, except NVLink multicast's, which stays as the machine set it.

    Returns:
      Each process's exit status (None if killed `timeout` seconds after the start) and output.
    """
    port = process_per_gpu.free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
    base.update({k: v for k, v in os.environ.items() if k == "NCCL_NVLS_ENABLE"})
    procs = []
    for i in range(hosts):
        gpus = range(i * gpus_per_host, (i + 1) * gpus_per_host)
        env = {
            **base,
            **LOOPBACK_NETWORK,
            **nccl,
            "CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus)),
            "NCCL_HOSTID": f"jia_jax_host_{i if separate else 0}",
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", *module_args(i, port)],
                cwd=harness.REPO,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    logs = []
    deadline = time.monotonic() + timeout  # one for all: a killed process gives the next none
    for p in procs:
        try:
            logs.append(p.communicate(timeout=max(0.0, deadline - time.monotonic()))[0])
        except subprocess.TimeoutExpired:
            p.kill()
            logs.append(p.communicate()[0] + "\n[killed: timeout]")
    return [p.returncode for p in procs], logs
