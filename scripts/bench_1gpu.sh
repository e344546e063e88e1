#!/usr/bin/env bash
# The one-GPU measurements of docs/benchmarks.md (issues: input at step speed, fastest step), in
# parts that each fit a 10-minute call; run from the repository root on a GPU machine:
#   OUT=/tmp/out bash scripts/bench_1gpu.sh input   # input per core, end to end, one image's stages
#   OUT=/tmp/out bash scripts/bench_1gpu.sh step    # the step vs flax, torch.compile; its profile
#   OUT=/tmp/out bash scripts/bench_1gpu.sh graphs  # the trainer with and without convolutions
#                                                   # in XLA's command buffers (BATCH, ROUNDS)
# On a machine with more GPUs, `input` also measures them all (one process, cores - 1 workers).
# Autotuning results are cached across the child processes (same kernels, same choices).
set -euo pipefail
export PYTHONUNBUFFERED=1 XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_per_fusion_autotune_cache_dir=/tmp/jia_jax_autotune"
data=/tmp/jia_bench_data
prepare_jpegs() {  # the generated JPEGs of scripts/bench/input.py, unless there
  python3 -c "from scripts.bench import input as b; b.prepare('$data', 1024, 'array_record')"
}
train_at() {  # train_at BATCH FLAG ...: the trainer at BATCH images per GPU, 600 steps, 16 cores
  taskset -c 0-15 python3 -m scripts.bench.train_input --data_dir=$data --per_gpu="$1" \
    --steps=600 --log_every=100 --timeout_s=150 "${@:2}" || true
}
case "$1" in
  input)
    taskset -c 0 python3 -m scripts.bench.input_stage_costs | tee "$OUT/input_stage_costs.log"
    python3 -m scripts.bench.input --data_dir=$data --cores 16 --worker_threads 2 4 8 \
      --loaders "grain processes" --seconds 8 --out="$OUT/bench_input.json"
    python3 -m scripts.bench.train_input --data_dir=$data --num_workers=$(($(nproc) - 1)) \
      --out="$OUT/bench_train_input.json"
    ;;
  step)
    # One after another on one GPU, in about 7 minutes: torch.compile; the trainer's default and
    # the plain flax step, ResNet-50 and AlexNet-BN, at 256 and 64 images; AlexNet-BN without
    # `model.sliced_max_pool` (on in its config). The budget cuts the last rows first (recorded
    # as skipped). Then the default step's profile with its optimized HLO (the same programs:
    # the compilation cache has them), the bytes per kernel, and the tables.
    export JAX_COMPILATION_CACHE_DIR=/tmp/jia_jax_compilation_cache
    python3 -m scripts.bench.peers --models=resnet50,alexnet_bn --batches=256,64 \
      --variant_models=alexnet_bn --model_options=no_sliced_max_pool \
      --budget_s=420 --out="$OUT/bench_peers.json"
    python3 -m scripts.bench.profile_step --steps=5 --trace_steps=3 --out="$OUT/profile_1gpu.json" \
      --cases=resnet50:1x1:xla:256,resnet50:1x1:xla:64 --hlo_dir=/tmp/jia_jax_hlo
    for batch in 256 64; do
      python3 -m scripts.bench.kernel_bandwidth --profile="$OUT/profile_1gpu.json" \
        --case=resnet50:1x1:xla:$batch --top=15 \
        --hlo=/tmp/jia_jax_hlo/resnet50_1x1_xla_$batch.hlo.gz
    done
    tar czf "$OUT/hlo.tgz" -C /tmp jia_jax_hlo
    python3 -m scripts.render "$OUT/profile_1gpu.json.kernels.json.gz" "$OUT/bench_peers.json"
    ;;
  graphs)
    # `python -m jia_jax.main` at BATCH images per GPU (64 unless set; 600 steps, 16 cores) on
    # synthetic data and on the GPU input path (nvImageCodec, 8 record-reading workers), with
    # the step's convolutions in XLA's command buffers (launch.convolution_graphs=auto, the
    # default) and without (never), one run after another, ROUNDS rounds (2 unless set).
    prepare_jpegs
    batch=${BATCH:-64}
    for round in $(seq "${ROUNDS:-2}"); do
      for variant in synthetic gpu; do
        for graphs in auto never; do
          train_at "$batch" --variants=$variant --num_workers=8 \
            --override=--config.launch.convolution_graphs=$graphs \
            --out="$OUT/graphs${batch}_${round}_${variant}_${graphs}.json"
        done
      done
    done
    ;;
  *) echo "usage: $0 input|step|graphs" >&2; exit 2 ;;
esac
