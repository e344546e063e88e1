#!/usr/bin/env bash
# Multi-node training under SLURM: one task (process) per node, each driving all GPUs of its node.
# jax.distributed.initialize() reads the SLURM environment, so no addresses are passed by hand.
#
#   sbatch --nodes=32 scripts/slurm_train.sh configs/resnet50_64k.py /ckpt/r50_64k \
#       --config.data.data_dir=/data/tensorflow_datasets
#
# Preemption: SLURM sends SIGTERM before killing the job (see --signal); the trainer saves a
# checkpoint at the next agreed step and exits 0. Requeue with the same workdir to resume.
#SBATCH --job-name=jia_jax
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=64
#SBATCH --signal=TERM@120
#SBATCH --requeue
#SBATCH --output=%x-%j.out
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: sbatch [--nodes=N] $0 CONFIG WORKDIR [--config.x=y ...]" >&2
  exit 2
fi
config=$1 workdir=$2
shift 2
# Mesh: one row per node ("node" = SLURM tasks), the GPUs of a node along "gpu" (NVLink).
exec srun --kill-on-bad-exit=1 python -m jia_jax.main --config="$config" --workdir="$workdir" \
  --config.mesh.node="${SLURM_NNODES}" --config.mesh.gpu=-1 "$@"
