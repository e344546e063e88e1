#!/usr/bin/env bash
# The GPU-decode measurements of docs/input_pipeline.md in one call (about 10 minutes) on a host
# with 2 GPUs and 32 or more cores, nvImageCodec installed (pip install -e ".[gpu]"); run from the
# repository root:
#   OUT=/tmp/out bash scripts/bench_gpu_decode.sh      # PROFILE=0: without the profiled run
#   OUT=/tmp/out bash scripts/bench_gpu_decode.sh depth  # data.gpu_decode_depth 1 against 2
# ResNet-50 64K config, bf16, on the generated JPEGs of scripts/bench/input.py: the trainer with
# data.decode=gpu against synthetic data at 256 images per GPU on 1 GPU (16 cores, the synthetic
# run at the same time on the other GPU and the other 16 cores) and on 2 GPUs (32 cores) in one
# process, and at 64 per GPU on 1 GPU; the GPU path alone on 2 GPUs as 2 processes of 1 GPU
# (scripts/launch_local.sh, NCCL over NVLink; the same 32 cores and workers in all), against the
# one-process synthetic run; the decode stage alone per GPU; and the smoke check (GPU path
# against CPU path on the same images and parameters), first: if it fails, nothing else runs.
# Writes $OUT/bench_gpu_decode.json (the record docs/input_pipeline.md renders),
# $OUT/gpu_decode_smoke.json, a profile of the 1-GPU step ($OUT/gpu_decode_profile.json) and the
# logs' tails in $OUT/bench_gpu_decode.log, and prints a summary last.
set -uo pipefail
: "${OUT:?set OUT to the folder for the results}"
export PYTHONUNBUFFERED=1
export XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_per_fusion_autotune_cache_dir=/tmp/jia_jax_autotune"
data=/tmp/jia_bench_data
runs=/tmp/jia_gpu_decode_runs
mkdir -p "$OUT" "$runs"
rm -f "$runs"/*.json "$runs"/*.log
# Cores per GPU: 16, or half the host's if it has fewer than 32.
half=$(( $(nproc) / 2 < 16 ? $(nproc) / 2 : 16 ))
first="0-$((half - 1))" second="$half-$((2 * half - 1))" both="0-$((2 * half - 1))"

# First the smoke check (it writes the dataset; a broken GPU path shows here in a minute), then
# the decode stage alone.
CUDA_VISIBLE_DEVICES=0 python3 -m scripts.bench.gpu_decode smoke --data_dir="$data" \
  --out="$OUT/gpu_decode_smoke.json" >"$runs/smoke.log" 2>&1 ||
  { echo "smoke failed: the GPU path is broken, nothing else is worth timing"; tail -n 30 "$runs/smoke.log"; exit 1; }
mode=${1:-all} depths=1
if [[ "$mode" == depth ]]; then depths="1 2"; fi
python3 -m scripts.bench.gpu_decode decode --data_dir="$data" --per_gpu 256 64 --depth $depths \
  --out="$runs/stage.json" >"$runs/stage.log" 2>&1 || echo "decode stage failed"

train() {  # train GPUS CORES PER_GPU STEPS LOG_EVERY VARIANTS WORKERS NAME [FLAG ...]
  CUDA_VISIBLE_DEVICES=$1 taskset -c "$2" python3 -m scripts.bench.train_input \
    --data_dir="$data" --per_gpu="$3" --steps="$4" --log_every="$5" --variants="$6" \
    --num_workers="$7" --timeout_s=240 --out="$runs/train_$8.json" "${@:9}" \
    >"$runs/$8.log" 2>&1 \
    || echo "train $8 failed: see the record's log tails"
}

if [[ "$mode" == depth ]]; then
  # One GPU at 256 and 64 images: one decoder a GPU (the default) on GPU 0 beside two taking the
  # batches in turn on GPU 1, 16 cores each, then the synthetic baseline on GPU 0 alone.
  for batch in "256 100 20" "64 200 40"; do
    set -- $batch
    train 0 "$first" "$1" "$2" "$3" gpu $((half / 2)) "1gpu_$1_gpu" &
    train 1 "$second" "$1" "$2" "$3" gpu $((half / 2)) "1gpu_$1_gpu_depth2" \
      --override=--config.data.gpu_decode_depth=2 &
    wait
    train 0 "$first" "$1" "$2" "$3" synthetic 0 "1gpu_$1_synthetic"
  done
  PROFILE=0
else
# 1 GPU, 16 cores each: the GPU path (8 record-reading workers) and, beside it, the synthetic
# baseline.
for batch in "256 100 20" "64 200 40"; do
  set -- $batch
  train 0 "$first" "$1" "$2" "$3" gpu $((half / 2)) "1gpu_$1_gpu" &
  train 1 "$second" "$1" "$2" "$3" synthetic 0 "1gpu_$1_synthetic" &
  wait
done
# 2 GPUs, 32 cores, one process (16 record-reading workers).
train 0,1 "$both" 256 100 20 synthetic,gpu "$half" 2gpu_256
# The GPU path on 2 GPUs as 2 processes of 1 GPU (the same 16 workers in all, 8 a process): one
# Python process and its input threads no longer feed both GPUs.
train 0,1 "$both" 256 100 20 gpu "$half" 2gpu_256_2proc --processes=2
fi

# Where the GPU path's step loses time: one GPU at 256, a trace of steps 60-64 summarised per
# device (idle: no kernel runs, the host is late; busy time per kind, the decoder's kernels
# included; the top kernels) into $OUT/gpu_decode_profile.json. PROFILE=0 skips it (about a
# minute), for a call that must stay inside 10 minutes.
if [[ "${PROFILE:-1}" == 1 ]]; then
CUDA_VISIBLE_DEVICES=0 taskset -c "$first" python3 -m scripts.bench.train_input \
  --data_dir="$data" --per_gpu=256 --steps=80 --log_every=20 --variants=gpu \
  --num_workers=$((half / 2)) --override=--config.profile.first_step=60 --timeout_s=240 \
  --out="$runs/profiled.json" >"$runs/profiled.log" 2>&1 || echo "profiled run failed"
python3 - "$runs/profiled.json" "$OUT/gpu_decode_profile.json" <<'PY' || echo "profile summary failed"
import json, re, sys
from scripts.bench import harness, profile_trace
run = json.load(open(sys.argv[1]))["results"][0]
workdir = re.search(r"--workdir=(\S+)", run["command"])[1]
kernels = profile_trace.load_kernels(f"{workdir}/profile/process_0")
doc = {"environment": harness.environment(), "run": run, "devices": {
    device: {"per_step": profile_trace.summarize(k, 5), "top": profile_trace.top_kernels(k, 5)}
    for device, k in kernels.items()}}
json.dump(doc, open(sys.argv[2], "w"), indent=1)
print({d: round(v["per_step"]["idle_us"] / 1e3, 1) for d, v in doc["devices"].items()}, "ms idle a step")
PY
fi

python3 -m scripts.bench.gpu_decode report --stage="$runs/stage.json" --runs "$runs"/train_*.json \
  --out="$OUT/bench_gpu_decode.json" || echo "report failed"

for log in "$runs"/*.log; do echo "== $log"; tail -n 40 "$log"; done >"$OUT/bench_gpu_decode.log"
echo "== summary"
python3 -m scripts.render "$OUT/bench_gpu_decode.json" || tail -5 "$runs"/*.log
python3 - "$OUT" <<'PY' || true
import json, os, sys
record = os.path.join(sys.argv[1], "bench_gpu_decode.json")
if os.path.exists(record):
    for run in json.load(open(record))["runs"]:
        for r in run["results"]:
            if "error" in r:
                print(f"failed: {run['gpus']} GPU(s), {run.get('processes', 1)} process(es), "
                      f"{r['variant']}: {r['log_tail'][-1:]}")
smoke = os.path.join(sys.argv[1], "gpu_decode_smoke.json")
if os.path.exists(smoke):
    s = json.load(open(smoke))
    keep = ("examples", "top1_cpu", "top1_gpu", "predictions_changed", "top1_bound",
            "bound_holds", "max_pixel_change", "mean_pixel_change", "labels_equal",
            "refused_by_gpu_decoder")
    print("smoke:", {k: s[k] for k in keep})
    for row in s["odd_images"]:
        print("  ", row)
PY
