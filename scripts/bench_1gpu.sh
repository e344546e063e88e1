#!/usr/bin/env bash
# The one-GPU measurements of docs/benchmarks.md (issues: input at step speed, fastest step), in
# parts that each fit a 10-minute call; run from the repository root on a GPU machine:
#   OUT=/tmp/out bash scripts/bench_1gpu.sh input   # input per core, end to end, one image's stages
#   OUT=/tmp/out bash scripts/bench_1gpu.sh step    # trainer vs plain flax vs torch.compile, profile
#   OUT=/tmp/out bash scripts/bench_1gpu.sh flags   # the 64-image step under XLA flag variants
#   OUT=/tmp/out bash scripts/bench_1gpu.sh fused   # fused BatchNorm, space-to-depth stem vs peers
# On a machine with more GPUs, `input` also measures them all (one process, cores - 1 workers).
# Autotuning results are cached across the child processes (same kernels, same choices).
set -euo pipefail
export PYTHONUNBUFFERED=1 XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_per_fusion_autotune_cache_dir=/tmp/jia_jax_autotune"
data=/tmp/jia_bench_data
case "$1" in
  input)
    taskset -c 0 python3 -m scripts.bench.input_stage_costs | tee "$OUT/input_stage_costs.log"
    python3 -m scripts.bench.input --data_dir=$data --cores 16 --worker_threads 2 4 8 \
      --loaders "grain processes" --seconds 8 --out="$OUT/bench_input.json"
    python3 -m scripts.bench.train_input --data_dir=$data --num_workers=$(($(nproc) - 1)) \
      --out="$OUT/bench_train_input.json"
    ;;
  step)
    python3 -m scripts.bench.peers --models=resnet50 --batches=256,64 --out="$OUT/bench_peers.json"
    python3 -m scripts.bench.peers --models=alexnet_bn --batches=512 --kinds=trainer,flax \
      --out="$OUT/bench_peers_alexnet.json"
    python3 -m scripts.bench.profile_step --trace_steps=3 --out="$OUT/profile_1gpu.json" \
      --cases=resnet50:1x1:xla:256,resnet50:1x1:xla:64
    ;;
  fused)
    # Each option alone and both, the trainer against the plain flax step (plain layers) and
    # torch.compile in the same call.
    for options in fused_bn space_to_depth_stem fused_bn,space_to_depth_stem; do
      python3 -m scripts.bench.peers --models=resnet50 --batches=256,64 --model_options=$options \
        --out="$OUT/bench_peers_${options//,/_}.json"
    done
    ;;
  flags)
    # Command buffers (CUDA graphs) matter most where kernels are short: the 64-image step.
    python3 -m scripts.bench.step --models=resnet50 --per_device_batch=64 --meshes=1x1 \
      --strategies=xla --budget_s=300 --variant_budget_s=240 --grace_s=20 \
      --xla_flags_variant="--xla_gpu_enable_command_buffer=" \
      --xla_flags_variant="--xla_gpu_graph_min_graph_size=2" \
      --xla_flags_variant="--xla_gpu_autotune_level=0" \
      --out="$OUT/bench_step_1gpu_64_flags.json"
    ;;
  *) echo "usage: $0 input|step|flags|fused" >&2; exit 2 ;;
esac
