#!/usr/bin/env bash
# N training processes on this machine, joined by jax.distributed over 127.0.0.1 (a local
# launcher for testing multi-process runs; on CPU each process gets DEVICES simulated devices).
#
#   scripts/launch_local.sh 2 4 configs/digits.py /tmp/jia_jax/digits_mp
set -euo pipefail
if [ $# -lt 4 ]; then
  echo "usage: $0 PROCESSES DEVICES_PER_PROCESS CONFIG WORKDIR [--config.x=y ...]" >&2
  exit 2
fi
procs=$1 devices=$2 config=$3 workdir=$4
shift 4
port=$(python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
pids=()
for ((i = 0; i < procs; i++)); do
  XLA_FLAGS="${XLA_FLAGS:-} --xla_force_host_platform_device_count=${devices}" \
  JAX_CPU_COLLECTIVES_IMPLEMENTATION=gloo \
  python -m jia_jax.main --config="$config" --workdir="$workdir" \
    --config.distributed.coordinator_address="127.0.0.1:${port}" \
    --config.distributed.num_processes="$procs" --config.distributed.process_id="$i" \
    --config.mesh.node="$procs" --config.mesh.gpu="$devices" "$@" &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit $status
