"""Distributed start-up and the 2-D ("node", "gpu") device mesh.

`node` is the slow level (processes / hosts), `gpu` the fast one (devices of one host, NVLink). The
batch is sharded over both axes; parameters and optimizer state are replicated.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import jax
import ml_collections
import numpy as np
from absl import logging
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jia_jax import liveness
from jia_jax import peer_watch

NODE_AXIS = "node"
GPU_AXIS = "gpu"
BATCH_AXES = (NODE_AXIS, GPU_AXIS)

# Environment variables that mean "this process is one task of a multi-process job" for the
# launchers jax.distributed.initialize() can detect by itself.
_CLUSTER_SIZE_VARS = ("SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


def process_count(dist: ml_collections.ConfigDict, environ: Mapping[str, str]) -> int:
    """The processes of a run with the `distributed` block `dist`, started with `environ`:
    `dist.num_processes` where a coordinator is given (a local launcher; 1 where it gives none,
    which `initialize_distributed` refuses), else the tasks of a SLURM / Open MPI / PMI job,
    else 1. Known before JAX starts."""
    if dist.coordinator_address:
        return dist.num_processes or 1
    return max(int(environ.get(v, "1")) for v in _CLUSTER_SIZE_VARS)


def initialize_distributed(dist: ml_collections.ConfigDict) -> peer_watch.PeerWatch:
    """Starts `jax.distributed` when this run is one of several processes.

    Explicit settings (a local launcher) win: `dist.coordinator_address`, `dist.num_processes` and
    `dist.process_id`. Otherwise a SLURM / Open MPI / PMI job with more than one task is
    auto-detected by JAX. A single process needs no initialization.

    Args:
      dist: the `distributed` config block.

    Returns:
      The watch that ends this process with one line if another one fails, stops, or is silent
      for `dist.heartbeat_timeout_s` (jia_jax/peer_watch.py); it watches nothing for one process,
      with `dist.watch_peers` off, or if `jax.distributed` was started before.
    """
    if jax.distributed.is_initialized():
        return peer_watch.PeerWatch()
    if dist.coordinator_address:
        if dist.num_processes is None or dist.process_id is None:
            raise ValueError(
                "distributed.coordinator_address is set, so distributed.num_processes and "
                "distributed.process_id must be set too (e.g. --config.distributed.num_processes=2 "
                "--config.distributed.process_id=0)."
            )
        explicit = {
            "coordinator_address": dist.coordinator_address,
            "num_processes": dist.num_processes,
            "process_id": dist.process_id,
        }
    elif process_count(dist, os.environ) > 1:
        explicit = {}
    else:
        return peer_watch.PeerWatch()
    timeout_kwargs = liveness.initialize_kwargs(dist.heartbeat_timeout_s, dist.watch_peers)
    jax.distributed.initialize(**explicit, **timeout_kwargs)
    logging.info(
        "jax.distributed: process %d of %d, %d local devices",
        jax.process_index(),
        jax.process_count(),
        jax.local_device_count(),
    )
    if not dist.watch_peers:
        return peer_watch.PeerWatch()
    return liveness.watch_this_job(dist.heartbeat_timeout_s)


def mesh_shape(node: int, gpu: int, num_devices: int, num_processes: int) -> tuple[int, int]:
    """Resolves the configured mesh shape; -1 means infer.

    With both inferred, `node` is the process count (one row per host). Any shape whose product is
    the device count may be asked for, e.g. 2x4 on one 8-GPU host to emulate two nodes.
    """
    if node == -1 and gpu == -1:
        node = num_processes
    if node == -1:
        node = num_devices // gpu if gpu > 0 and num_devices % gpu == 0 else 0
    if gpu == -1:
        gpu = num_devices // node if node > 0 and num_devices % node == 0 else 0
    if node <= 0 or gpu <= 0 or node * gpu != num_devices:
        raise ValueError(
            f"mesh.node x mesh.gpu must equal the number of devices ({num_devices}); got "
            f"mesh.node={node}, mesh.gpu={gpu}. Set --config.mesh.node and --config.mesh.gpu to "
            "factors of the device count, or -1 to infer one of them."
        )
    return node, gpu


def create_mesh(node: int = -1, gpu: int = -1, devices: list[jax.Device] | None = None) -> Mesh:
    """Builds the ("node", "gpu") mesh over `devices` (default: all devices of all processes).

    Devices are ordered by (process, id) so that each process's devices are contiguous along `gpu`:
    the fast axis then stays inside one host whenever the shape allows.
    """
    devices = list(jax.devices() if devices is None else devices)
    devices.sort(key=lambda d: (d.process_index, d.id))
    processes = len({d.process_index for d in devices})
    node, gpu = mesh_shape(node, gpu, len(devices), processes)
    return Mesh(np.array(devices, dtype=object).reshape(node, gpu), BATCH_AXES)


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Leading (batch) dimension split over every device of the mesh."""
    return NamedSharding(mesh, P(BATCH_AXES))


def replicated_sharding(mesh: Mesh) -> NamedSharding:
    """A full copy on every device (parameters, optimizer state)."""
    return NamedSharding(mesh, P())
