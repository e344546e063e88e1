#!/usr/bin/env bash
# The one-GPU measurements of docs/benchmarks.md (issues: input at step speed, fastest step), in
# parts that each fit a 10-minute call; run from the repository root on a GPU machine:
#   OUT=/tmp/out bash scripts/bench_1gpu.sh input   # input per core, end to end, one image's stages
#   OUT=/tmp/out bash scripts/bench_1gpu.sh step    # the step's levers vs flax, torch.compile; profile
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
    # One after another on one GPU, in about 7 minutes: the 64-image ResNet-50 step with
    # convolutions added to XLA's command buffers (CUDA graphs; CONVOLUTION is a command type of
    # jax 0.10's and 0.11's XLA, not of older ones: a variant, never a default); torch.compile;
    # the trainer's default and the plain flax step, ResNet-50 and AlexNet-BN, at 256 and 64
    # images; ResNet-50 with the plain layers (every step option off) and with each option off
    # alone. The budget cuts the last option sets first (recorded as skipped). Then the default
    # step's profile (the same programs: the compilation cache has them), and the tables.
    export JAX_COMPILATION_CACHE_DIR=/tmp/jia_jax_compilation_cache
    python3 -m scripts.bench.peers --models=resnet50,alexnet_bn --batches=256,64 \
      --variant_models=resnet50 --variant_batches=64 \
      --xla_flags_variant=--xla_gpu_enable_command_buffer=+CONVOLUTION \
      --model_options=no_space_to_depth_stem,no_sliced_max_pool \
      --model_options=no_space_to_depth_stem --model_options=no_sliced_max_pool \
      --budget_s=420 --out="$OUT/bench_peers.json"
    python3 -m scripts.bench.profile_step --steps=5 --trace_steps=3 --out="$OUT/profile_1gpu.json" \
      --cases=resnet50:1x1:xla:256,resnet50:1x1:xla:64
    python3 -m scripts.render "$OUT/profile_1gpu.json.kernels.json.gz" "$OUT/bench_peers.json"
    ;;
  *) echo "usage: $0 input|step" >&2; exit 2 ;;
esac
