#!/usr/bin/env bash
# N training processes on this machine, joined by jax.distributed over 127.0.0.1: a local launcher
# for multi-process runs, e.g. two "nodes" of one GPU each on a 2-GPU host, or on the CPU.
#
#   scripts/launch_local.sh 2 4 configs/digits.py /tmp/jia_jax/digits_mp       # CPU: 2 x 4 devices
#   scripts/launch_local.sh 2 1 configs/resnet50_64k.py /tmp/r50 --config.data.name=synthetic
#   scripts/launch_local.sh --hosts 2 2 configs/resnet50_64k.py /tmp/r50 --config.data.name=synthetic
#
# With GPUs (nvidia-smi, or the caller's CUDA_VISIBLE_DEVICES where set, lists at least
# PROCESSES x DEVICES_PER_PROCESS of them) process i sees GPUs i*D .. i*D+D-1 of that list through
# CUDA_VISIBLE_DEVICES and NCCL joins the processes; otherwise each process simulates D CPU
# devices and gloo joins them. JIA_JAX_PLATFORM=cpu|gpu forces one.
# The mesh is node=PROCESSES x gpu=DEVICES_PER_PROCESS. Exits with the first failing status.
#
# --hosts: each process is a host of its own to NCCL (a cluster on one machine). NCCL tells hosts
# apart by a host hash that NCCL_HOSTID overrides; processes of different hashes never use NVLink
# or shared memory between them, only its network transport: here TCP sockets on loopback, a
# 19-57 Gbit/s network between NVLink islands (docs/benchmarks.md, "Across hosts", measures it).
# The socket settings are the fastest measured there; any NCCL_* variable already set wins.
# Unless the caller names one, the trainers get --config.comm.network=emulated: the links
# `comm.strategy=auto` plans for, and XLA's scheduler is told of, are then the ones fitted on
# such a machine, not a real network's. Without --hosts the processes are one host to the
# trainers too (JIA_JAX_LOCAL_PROCESSES): XLA is told of no network.
#
# SIGTERM or SIGINT (Ctrl-C) to the launcher reaches every trainer once: each saves a checkpoint
# and exits 0, and the launcher exits when all have. The trainers run in process groups of their
# own (set -m), so a signal to the launcher's group (Ctrl-C in a terminal) is not delivered to
# them a second time, which would stop them at once without saving.
set -euo pipefail
set -m
hosts=0
if [ "${1:-}" = --hosts ]; then hosts=1; shift; fi
if [ $# -lt 4 ]; then
  echo "usage: $0 [--hosts] PROCESSES DEVICES_PER_PROCESS CONFIG WORKDIR [--config.x=y ...]" >&2
  exit 2
fi
procs=$1 devices=$2 config=$3 workdir=$4
shift 4
for count in "PROCESSES=$procs" "DEVICES_PER_PROCESS=$devices"; do
  if ! [[ ${count#*=} =~ ^[1-9][0-9]*$ ]]; then
    echo "$0: $count must be a whole number >= 1." >&2
    exit 2
  fi
done
platform=${JIA_JAX_PLATFORM:-}
# The GPUs to share out: those the caller's CUDA_VISIBLE_DEVICES lists (ordinals or UUIDs) if it
# is set, else all of the machine's.
listed=()
if [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then
  IFS=, read -r -a listed <<<"$CUDA_VISIBLE_DEVICES"
  gpus=${#listed[@]}
else
  read -r -a listed <<<"$(seq -s ' ' 0 $((procs * devices - 1)))"  # the machine's first ordinals
  [ -n "$platform" ] || gpus=$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU' || true)
fi
if [ -z "$platform" ]; then
  if [ "$gpus" -ge $((procs * devices)) ]; then platform=gpu; else platform=cpu; fi
fi
# Only the caller's list can be short: the machine's ordinals are as many as needed.
if [ "$platform" = gpu ] && [ "${#listed[@]}" -lt $((procs * devices)) ]; then
  echo "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES lists ${#listed[@]} GPU(s); $procs processes" \
    "of $devices need $((procs * devices)): list more, or unset it to use all." >&2
  exit 2
fi
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
network=()
links=()
if [ "$hosts" = 1 ]; then
  network=(NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-lo}" NCCL_NET="${NCCL_NET:-Socket}"
    NCCL_IB_DISABLE="${NCCL_IB_DISABLE:-1}" NCCL_SOCKET_NTHREADS="${NCCL_SOCKET_NTHREADS:-4}"
    NCCL_NSOCKS_PERTHREAD="${NCCL_NSOCKS_PERTHREAD:-4}")
  links=(--config.comm.network=emulated)
  for arg in "$@"; do
    case "$arg" in --config.comm.network | --config.comm.network=*) links=() ;; esac
  done
fi
pids=()
forward() { kill -s "$1" "${pids[@]}" 2>/dev/null || true; }
trap 'forward TERM' TERM
trap 'forward INT' INT
for ((i = 0; i < procs; i++)); do
  if [ "$platform" = gpu ]; then
    visible=$(IFS=,; echo "${listed[*]:$((i * devices)):$devices}")
    env_vars=(CUDA_VISIBLE_DEVICES="$visible")
  else
    # The caller's flags are kept; the last device count given wins.
    env_vars=(XLA_FLAGS="${XLA_FLAGS:-} --xla_force_host_platform_device_count=${devices}"
      JAX_PLATFORMS=cpu JAX_CPU_COLLECTIVES_IMPLEMENTATION=gloo)
  fi
  # The job's processes on this "host", for what the trainer tells XLA (jia_jax/xla_network.py).
  env_vars+=(JIA_JAX_LOCAL_PROCESSES="$([ "$hosts" = 1 ] && echo 1 || echo "$procs")")
  if [ "$hosts" = 1 ]; then env_vars+=(NCCL_HOSTID="jia_jax_host_$i" "${network[@]}"); fi
  env "${env_vars[@]}" python3 -m jia_jax.main --config="$config" --workdir="$workdir" \
    --config.distributed.coordinator_address="127.0.0.1:${port}" \
    --config.distributed.num_processes="$procs" --config.distributed.process_id="$i" \
    --config.mesh.node="$procs" --config.mesh.gpu="$devices" ${links[@]+"${links[@]}"} "$@" &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do
  # A trapped signal ends `wait` early: wait again while the trainer runs. Bash's own report of
  # a trainer killed by a signal ("line N: PID Killed env ...") goes to /dev/null: the trainers
  # say themselves why they stopped.
  while s=0 && { wait "$pid" 2>/dev/null || s=$?; } && kill -0 "$pid" 2>/dev/null; do :; done
  [ "$status" -ne 0 ] || status=$s
done
exit $status
