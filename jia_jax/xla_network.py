"""Tell XLA's latency-hiding scheduler how large the hosts are and how fast the network is.

On Hopper and newer GPUs XLA schedules a step's collectives with its speed-of-light latency
estimator, which takes a collective within one partition of devices (`partition_size`; unless
told, the compiled module's own or `gpus_per_node`, 8) for NVLink traffic, and one across nodes
for a ring over `gpus_per_node` NICs a node, of its own assumed speed (openxla/xla,
xla/service/gpu/model/sol_latency_estimator.cc, `GetPartitionSize`). Both must be told: with
`gpus_per_node` alone XLA compiled the untold schedule. The scheduler
starts each asynchronous all-reduce only as early as that estimate needs. Across hosts of fewer
GPUs, or over a slower network, the estimate is a small fraction of the wire time and the buckets
leave late in backward: across two emulated hosts of one GPU at 64 images per GPU, XLA packed
and sent ResNet-50's first bucket after 110 of the step's 158 convolutions (docs/benchmarks.md,
"Does telling XLA the network start the buckets earlier?"). Told the GPUs per host and the
network's bandwidth and latency per GPU (`xla_gpu_analytical_latency_estimator_options`), it
started it after 68.

XLA reads the option from XLA_FLAGS once, when JAX starts its backend, so `jia_jax.main` adds it
to the environment before then (`environment`), and logs what it told, in runs of several
processes on several hosts only: one host has no network to tell of. The GPUs per host are the
GPUs this process sees (CUDA_VISIBLE_DEVICES, else the machine's) times the job's processes on
this host, as the launcher says (`local_processes`): one per host unless it says more, as
SLURM's one task per node and `scripts/launch_local.sh --hosts` run it.
"""

from __future__ import annotations

import glob
import re
from collections.abc import Mapping
from typing import Any

from jia_jax import comm_model
from jia_jax import mesh

OPTION = "--xla_gpu_analytical_latency_estimator_options"
# What `jia_jax.main` logs before the option's value (`told`), read back by scripts/bench/hosts.py.
TOLD_LOG = "XLA's latency estimator told the hosts and network: "


def estimator_flag(gpus_per_host: int, link: comm_model.Link) -> str:
    """The XLA flag that gives the estimator `gpus_per_host` (as the GPUs and NICs of a node and
    as the devices of one fast-interconnect partition) and `link` (the network as one GPU sees
    it: `comm_model.CommModel.inter`): bandwidth in 10^9 bytes/s (XLA's unit for
    `nic_speed_gbps`), per-step latency in whole microseconds (at least 1).

    Raises:
      ValueError: `gpus_per_host` is below 1 or the link's bandwidth is not positive.
    """
    if gpus_per_host < 1 or link.beta_bytes_per_s <= 0:
        raise ValueError(
            f"Need at least one GPU per host and a positive bandwidth; got {gpus_per_host} and "
            f"{link.beta_bytes_per_s} bytes/s."
        )
    rtt_us = max(1, round(link.alpha_s * 1e6))
    return (
        f"{OPTION}=gpus_per_node={gpus_per_host},partition_size={gpus_per_host},"
        f"nic_speed_gbps={link.beta_bytes_per_s / 1e9:.3f},rtt_us={rtt_us}"
    )


def with_estimator(xla_flags: str, gpus_per_host: int, link: comm_model.Link) -> str:
    """`xla_flags` (an XLA_FLAGS value) with `estimator_flag` appended, unless they set the
    option already (the user's own wins)."""
    if OPTION in xla_flags:
        return xla_flags
    return f"{xla_flags} {estimator_flag(gpus_per_host, link)}".strip()


def told(xla_flags: str) -> str:
    """What `xla_flags` (an XLA_FLAGS value) tell the estimator (the option's value), or ""."""
    found = re.search(rf"{OPTION}=(\S+)", xla_flags)
    return found.group(1) if found else ""


# Launchers' counts of a job's processes on this host: jia_jax's own (scripts/launch_local.sh),
# Open MPI's, SLURM's (tasks per node, e.g. "4" or "4(x2)").
LOCAL_PROCESSES = "JIA_JAX_LOCAL_PROCESSES"
_LOCAL_PROCESSES_VARS = (
    LOCAL_PROCESSES,
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "SLURM_NTASKS_PER_NODE",
)


def local_processes(environ: Mapping[str, str]) -> int:
    """The job's processes on this host, as the launcher says (the first of
    `_LOCAL_PROCESSES_VARS` set to a count), else 1: one process per host."""
    for name in _LOCAL_PROCESSES_VARS:
        found = re.match(r"\s*(\d+)", environ.get(name, ""))
        if found and int(found.group(1)) > 0:
            return int(found.group(1))
    return 1


def one_host(processes: int, environ: Mapping[str, str]) -> bool:
    """Whether a job of `processes` processes runs on one host: one process, or as many on this
    host as its launcher says (`local_processes`)."""
    return processes == 1 or local_processes(environ) >= processes


def visible_gpus(environ: Mapping[str, str]) -> list[str]:
    """The GPUs a process started with `environ` sees, as CUDA_VISIBLE_DEVICES names them: its
    entries where set (up to the first invalid one, as CUDA reads it), else the ordinals of the
    machine's NVIDIA device files."""
    listed = environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return [str(i) for i in range(len(glob.glob("/dev/nvidia[0-9]*")))]
    gpus = []
    for entry in listed.split(","):
        if not re.fullmatch(r"\s*(\d+|GPU-[0-9a-fA-F-]+|MIG-[\w/-]+)\s*", entry):
            break
        gpus.append(entry.strip())
    return gpus


def told_link(network: str, scale: float = 1.0) -> comm_model.Link:
    """The network link told to XLA: `network`'s (`comm.network`), its bandwidth times `scale`
    (`comm.told_bandwidth_scale`).

    Raises:
      ValueError: `network` names no network of the calibration, or `scale` is not a positive
        number.
    """
    link = comm_model.network_model(network).inter
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
        raise ValueError(
            f"comm.told_bandwidth_scale={scale!r}: give a positive number, the share of "
            "comm.network's bandwidth to tell XLA (1 tells it as calibrated)."
        )
    return comm_model.Link(link.alpha_s, link.beta_bytes_per_s * scale)


def environment(comm: Any, dist: Any, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables to add to `environ` before JAX starts: XLA_FLAGS with the estimator told
    the hosts' size (the GPUs this process sees times the job's processes on this host,
    `local_processes`) and the link `told_link` gives, where `comm.tell_xla_network` asks for it,
    the run spans hosts (`dist`, the `distributed` block, and the launcher's environment: one
    host has no network), the process sees a GPU, and the user's XLA_FLAGS do not set the option
    already.

    Raises:
      ValueError: as `told_link`.
    """
    if not comm.get("tell_xla_network", False):
        return {}
    # A bad name or scale fails in one process too.
    link = told_link(comm.network, comm.get("told_bandwidth_scale", 1.0))
    processes = mesh.process_count(dist, environ)
    if one_host(processes, environ):
        return {}  # no network
    flags = environ.get("XLA_FLAGS", "")
    gpus = len(visible_gpus(environ)) * local_processes(environ)
    if gpus < 1:
        return {}
    told = with_estimator(flags, gpus, link)
    return {} if told == flags else {"XLA_FLAGS": told}
