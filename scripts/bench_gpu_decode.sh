#!/usr/bin/env bash
# The GPU-decode measurements of docs/input_pipeline.md on a host with 2 GPUs and 32 or more
# cores (`one` and `depth`: 1 GPU and 16 cores), nvImageCodec installed (pip install -e
# ".[gpu]"), in parts that each fit a 10-minute call; run from the repository root:
#   OUT=/tmp/out bash scripts/bench_gpu_decode.sh one    # 1 GPU, 256 and 64 images; PROFILE=0:
#                                                        # without the profiled run
#   OUT=/tmp/out bash scripts/bench_gpu_decode.sh two    # 2 GPUs: one process, one per GPU
#   OUT=/tmp/out bash scripts/bench_gpu_decode.sh split  # 2 GPUs: a process per GPU started by
#                                  # jia_jax.main itself against launch_local.sh's, 2 rounds
#   OUT=/tmp/out bash scripts/bench_gpu_decode.sh depth  # data.gpu_decode_depth 1 against 2
#   OUT=/tmp/out BATCH=64 bash scripts/bench_gpu_decode.sh kernels  # data.gpu_crop_kernel
#                                  # pallas against xla, alternating, 2 rounds, at BATCH per GPU
#   OUT=/tmp/out BATCH=64 bash scripts/bench_gpu_decode.sh workers  # 8 record-reading workers
#                                  # against 4, alternating, 2 rounds, at BATCH per GPU
#   OUT=/tmp/out bash scripts/bench_gpu_decode.sh chroma  # chroma interpolated against repeated
#                                  # (data.gpu_fancy_upsampling), alternating, 2 rounds, at BATCH
#                                  # (256 unless set) per GPU; the runs only
#   OUT=/tmp/out bash scripts/bench_gpu_decode.sh prealloc  # nvJPEG's hardware decoder with
#                                  # its buffers sized up front (data.gpu_decoder_options)
#                                  # against growing them, alternating, 2 rounds, at BATCH (256
#                                  # unless set); the logged intervals show the first steps
#   OUT=/tmp/out bash scripts/bench_gpu_decode.sh rounds  # 1 GPU: synthetic and the GPU path
#                                  # in turn, ROUNDS rounds (3 unless set), at BATCH (256 unless
#                                  # set), each against its own round's synthetic run; the runs only
# A 1-GPU run trains 300 steps at 256 images and 600 at 64 unless STEPS says how many (longer runs
# see more of the garbage collector's rare full passes, which a median interval passes over);
# each records its collector's passes (train_input --gc_log).
#   OUT=/tmp/out bash scripts/bench_gpu_decode.sh xla_flags  # 1 GPU: synthetic and the GPU
#                                  # path with XLA's defaults, then with FLAGS (the step's
#                                  # temporary buffers from an allocator of their own unless
#                                  # set), at each of BATCHES (64 unless set; XLA's defaults
#                                  # only at those of PLAIN_BATCHES, all unless set), ROUNDS (1
#                                  # unless set), with XLA's log of command-buffer updates; the
#                                  # runs only
#   OUT=/tmp/out PROFILE_BATCH=64 bash scripts/bench_gpu_decode.sh trace  # the smoke check and
#                                  # the profile below only (about 3 minutes)
# ResNet-50 64K config, bf16, on the generated JPEGs of scripts/bench/input.py: the trainer with
# data.decode=gpu against synthetic data, one run after another, never beside another run (a
# run on the other GPU takes a share of the host's memory bandwidth and PCIe): at 256 and 64
# images per GPU on 1 GPU (16 cores); at 256 on 2 GPUs (32 cores) in one process, and the GPU
# path on 2 GPUs as 2 processes of 1 GPU (scripts/launch_local.sh, NCCL over NVLink; the same 32
# cores and workers in all) against the one-process synthetic run. Each run trains long enough
# for 5 logged intervals of several seconds. First the smoke check (GPU path against CPU path on
# the same images and parameters; if it fails, nothing else runs), then the decode stage alone,
# nvImageCodec's whole-image decode with its top kernels per image, the records read alone (no
# decoding), and the crop-and-resize program alone. Writes $OUT/bench_gpu_decode.json (the
# record docs/input_pipeline.md renders), $OUT/gpu_decode_smoke.json,
# $OUT/gpu_decode_records.json, $OUT/gpu_decode_crop.json, with `one` traces of the 1-GPU step,
# synthetic and on the GPU path, at PROFILE_BATCH images (256 unless set), summarised in
# $OUT/gpu_decode_profile.json, and the logs' tails in $OUT/bench_gpu_decode.log, and prints a
# summary last.
set -uo pipefail
: "${OUT:?set OUT to the folder for the results}"
mode=${1:-}
case "$mode" in
  one|two|split|depth|kernels|workers|chroma|prealloc|rounds|xla_flags|trace) ;;
  *) echo "usage: OUT=<folder> $0 one|two|split|depth|kernels|workers|chroma|prealloc|rounds|xla_flags|trace" >&2
     exit 2 ;;
esac
export PYTHONUNBUFFERED=1
export XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_per_fusion_autotune_cache_dir=/tmp/jia_jax_autotune"
data=/tmp/jia_bench_data
runs=/tmp/jia_gpu_decode_runs
mkdir -p "$OUT" "$runs"
rm -f "$runs"/*.json "$runs"/*.log
# Cores per GPU: 16, or the host's share per GPU if it has fewer (`one` runs on a 1-GPU host of
# 16 cores as on a 2-GPU host of 32).
gpus=$(nvidia-smi -L | wc -l)
share=$(( $(nproc) / (gpus > 0 ? gpus : 1) ))
half=$(( share < 16 ? share : 16 ))
first="0-$((half - 1))" both="0-$((2 * half - 1))"

# First the smoke check (it writes the dataset; a broken GPU path shows here in a minute), then
# the decode stage alone.
CUDA_VISIBLE_DEVICES=0 python3 -m scripts.bench.gpu_decode smoke --data_dir="$data" \
  --out="$OUT/gpu_decode_smoke.json" >"$runs/smoke.log" 2>&1 ||
  { echo "smoke failed: the GPU path is broken, nothing else is worth timing"; tail -n 30 "$runs/smoke.log"; exit 1; }
depths=1
if [[ "$mode" == depth ]]; then depths="1 2"; fi
# (`split` compares ways of starting the same trainers, `chroma` two settings of the decoders
# end to end: the stages alone are not their question.)
case "$mode" in trace|split|chroma|prealloc|rounds|xla_flags) stages=0 ;; *) stages=1 ;; esac
if (( stages )); then
python3 -m scripts.bench.gpu_decode decode --data_dir="$data" --per_gpu 256 64 --depth $depths \
  --out="$runs/stage.json" >"$runs/stage.log" 2>&1 || echo "decode stage failed"
# The host half alone (records read by the trainer's 8 workers on the first GPU's cores): where a
# run waits for input, whether reading or decoding falls behind.
taskset -c "$first" python3 -m scripts.bench.gpu_decode records --data_dir="$data" \
  --per_gpu 256 64 --num_workers=$((half / 2)) --out="$OUT/gpu_decode_records.json" \
  >"$runs/records.log" 2>&1 || echo "records failed"
# The crop-and-resize program alone: its time adds to the step's on the GPU path (not in
# `workers`, whose five runs take the rest of a 10-minute call).
[[ "$mode" == workers ]] || python3 -m scripts.bench.gpu_decode crop --data_dir="$data" \
  --per_gpu 256 64 --crop_kernels xla pallas \
  --out="$OUT/gpu_decode_crop.json" >"$runs/crop.log" 2>&1 || echo "crop program failed"
fi

train() {  # train GPUS CORES PER_GPU STEPS LOG_EVERY VARIANTS WORKERS NAME [FLAG ...]
  CUDA_VISIBLE_DEVICES=$1 taskset -c "$2" python3 -m scripts.bench.train_input \
    --data_dir="$data" --per_gpu="$3" --steps="$4" --log_every="$5" --variants="$6" \
    --num_workers="$7" --timeout_s=240 --out="$runs/train_$8.json" "${@:9}" \
    >"$runs/$8.log" 2>&1 \
    || echo "train $8 failed: see the record's log tails"
}

one_gpu() {  # one_gpu PER_GPU VARIANTS WORKERS NAME [FLAG ...]: GPU 0, its 16 cores, 5 logged
  # intervals after the first, of about 2-3 s unless STEPS (the steps of each run) is set.
  local steps=${STEPS:-$(( $1 == 256 ? 300 : 600 ))}
  train 0 "$first" "$1" "$steps" $(( steps / 6 )) "${@:2}" --thread_cpu --gc_log
}
in_turns() {  # in_turns PER_GPU FIELD VALUE ...: 1 GPU, the synthetic baseline, then the GPU
  # path with data.FIELD at each VALUE in turn, two rounds (runs named by the VALUE's letters,
  # digits, dots and dashes, the rest as _).
  one_gpu "$1" synthetic 0 "1gpu_$1_synthetic"
  for round in 1 2; do
    for value in "${@:3}"; do
      one_gpu "$1" gpu $((half / 2)) "1gpu_$1_gpu_$2_${value//[^A-Za-z0-9.-]/_}_${round}" \
        --override=--config.data."$2"="$value"
    done
  done
}
case "$mode" in
  one)
    # 1 GPU: the synthetic baseline, then the GPU path (8 record-reading workers).
    for batch in 256 64; do
      one_gpu "$batch" synthetic 0 "1gpu_${batch}_synthetic"
      one_gpu "$batch" gpu $((half / 2)) "1gpu_${batch}_gpu"
    done ;;
  two)
    # 2 GPUs, 32 cores, one process (16 record-reading workers); then the GPU path as 2
    # processes of 1 GPU (the same 16 workers in all, 8 a process): one Python process and its
    # input threads no longer feed both GPUs.
    train 0,1 "$both" 256 300 50 synthetic,gpu "$half" 2gpu_256
    train 0,1 "$both" 256 300 50 gpu "$half" 2gpu_256_2proc --processes=2
    PROFILE=0 ;;
  split)
    # 2 GPUs, 32 cores: the one-process synthetic baseline, then the GPU path as
    # `python -m jia_jax.main` runs it by default on a machine of several GPUs (it starts a
    # process per GPU itself, distributed.process_per_gpu=auto) and as launch_local.sh starts
    # the same processes, in turns, two rounds.
    train 0,1 "$both" 256 300 50 synthetic "$half" 2gpu_256_synthetic
    for round in 1 2; do
      train 0,1 "$both" 256 300 50 gpu "$half" "2gpu_256_main_$round" --processes=2 \
        --launcher=main
      train 0,1 "$both" 256 300 50 gpu "$half" "2gpu_256_2proc_$round" --processes=2
    done
    PROFILE=0 ;;
  depth)
    # 1 GPU: the synthetic baseline, then one decoder a GPU (the default) and two taking the
    # batches in turn.
    for batch in 256 64; do
      one_gpu "$batch" synthetic 0 "1gpu_${batch}_synthetic"
      one_gpu "$batch" gpu $((half / 2)) "1gpu_${batch}_gpu"
      one_gpu "$batch" gpu $((half / 2)) "1gpu_${batch}_gpu_depth2" \
        --override=--config.data.gpu_decode_depth=2
    done
    PROFILE=0 ;;
  kernels)
    # 1 GPU: the GPU path cropping with each kernel in turn, at BATCH images per GPU (64 unless
    # set; both fit one call).
    in_turns "${BATCH:-64}" gpu_crop_kernel pallas xla
    PROFILE=0 ;;
  workers)
    # 1 GPU: the synthetic baseline, then the GPU path with half the cores as record-reading
    # workers (the default of this script's other modes) and a quarter in turn, two rounds, at
    # BATCH images per GPU (256 unless set): whether fewer workers leave the decoder's CPU
    # threads more of the cores than they take from reading.
    batch=${BATCH:-256}
    one_gpu "$batch" synthetic 0 "1gpu_${batch}_synthetic"
    for round in 1 2; do
      for workers in $((half / 2)) $((half / 4)); do
        one_gpu "$batch" gpu "$workers" "1gpu_${batch}_gpu_w${workers}_${round}"
      done
    done
    PROFILE=0 ;;
  chroma)
    # 1 GPU: the GPU path with chroma interpolated (the default) and repeated in turn, at BATCH
    # images per GPU (256 unless set): what nvJPEG's colour kernels, the GPU path's largest
    # beside the step, cost it end to end.
    in_turns "${BATCH:-256}" gpu_fancy_upsampling True False
    PROFILE=0 ;;
  prealloc)
    # 1 GPU: the GPU path with nvJPEG's hardware decoder growing its buffers as batches come
    # (the default) and with them sized up front for the batch, in turn, at BATCH images per GPU
    # (256 unless set): whether the slow decoding of a run's first ~150 steps is that growth
    # (nvJPEG's default allocator frees with cudaFree, which waits for the queued train steps).
    batch=${BATCH:-256}
    sized="nvjpeg_hw_decoder:preallocate_batch_size=$batch"
    sized+=" nvjpeg_hw_decoder:preallocate_width_hint=512"
    sized+=" nvjpeg_hw_decoder:preallocate_height_hint=512"
    in_turns "$batch" gpu_decoder_options "" "$sized"
    PROFILE=0 ;;
  rounds)
    # 1 GPU at BATCH images per GPU (256 unless set): the synthetic run and the GPU path in turn,
    # ROUNDS rounds (3 unless set), each GPU-path run against its own round's synthetic run: a
    # ratio near its target told from the call's own spread.
    batch=${BATCH:-256}
    for round in $(seq "${ROUNDS:-3}"); do
      one_gpu "$batch" synthetic 0 "1gpu_${batch}_synthetic_${round}"
      one_gpu "$batch" gpu $((half / 2)) "1gpu_${batch}_gpu_${round}"
    done
    PROFILE=0 ;;
  xla_flags)
    # 1 GPU at each of BATCHES images per GPU: the synthetic run and the GPU path with XLA's
    # defaults (at the batches of PLAIN_BATCHES), then both with FLAGS, ROUNDS rounds, each
    # GPU-path run against the synthetic run given the same flags, each with XLA's log of its
    # command-buffer updates (train_input --command_buffer_log). The default FLAGS give the
    # step's temporary buffers an allocator of their own (CUDA's stream-ordered pool), which
    # hands them the same address every step, so XLA records none of their commands again; in
    # this XLA that allocator also makes each step's call wait for the step
    # (docs/input_pipeline.md): a diagnosis, not a setting to train with.
    batches=${BATCHES:-64} flags=${FLAGS:---xla_gpu_temp_buffer_use_separate_color=true}
    for round in $(seq "${ROUNDS:-1}"); do
      for batch in $batches; do
        for given in "" "$flags"; do
          if [[ -z "$given" && " ${PLAIN_BATCHES:-$batches} " != *" $batch "* ]]; then continue; fi
          tag=${given:+_flags}
          one_gpu "$batch" synthetic 0 "1gpu_${batch}_synthetic${tag}_${round}" \
            --command_buffer_log ${given:+--xla_flags="$given"}
          one_gpu "$batch" gpu $((half / 2)) "1gpu_${batch}_gpu${tag}_${round}" \
            --command_buffer_log ${given:+--xla_flags="$given"}
        done
      done
    done
    PROFILE=0 ;;
  trace) PROFILE=1 ;;  # the profile alone
esac

# Where the GPU path's step loses time: one GPU at PROFILE_BATCH images (256 unless set), the
# synthetic run and the GPU path, each traced for 10 steps once steady (after its first 300
# steps at 256 images, 1,200 at 64: the GPU path's decoding is slower for about its first 150
# steps) without Python's tracer, which slows the host, and summarised per device
# (idle: no kernel runs; where the idle gaps sit and what precedes them; busy time per kind, the
# decoder's kernels included; the top kernels; how the kernels of XLA's stream follow each
# other; the host's time in each jitted call, and in the step's calls by what it spends it on,
# `launch`) into $OUT/gpu_decode_profile.json, their kernels in
# $OUT/gpu_decode_profile.json.kernels.json.gz (profile_trace.dump_kernels per variant and
# device). PROFILE=0 skips it (about two minutes), for a call that must stay inside 10 minutes.
if [[ "${PROFILE:-1}" == 1 ]]; then
pbatch=${PROFILE_BATCH:-256}
psteps=$(( pbatch >= 256 ? 320 : 1220 )) traced=10
for variant in synthetic gpu; do
  CUDA_VISIBLE_DEVICES=0 taskset -c "$first" python3 -m scripts.bench.train_input \
    --data_dir="$data" --per_gpu="$pbatch" --steps="$psteps" --log_every=$(( psteps / 4 )) \
    --variants="$variant" --num_workers=$((half / 2)) \
    --override=--config.profile.first_step=$(( psteps - 2 * traced )) \
    --override=--config.profile.steps=$traced --override=--config.profile.python=False \
    --timeout_s=240 \
    --out="$runs/profiled_$variant.json" >"$runs/profiled_$variant.log" 2>&1 \
    || echo "profiled $variant run failed"
done
python3 - "$runs" "$OUT/gpu_decode_profile.json" "$traced" <<'PY' || echo "profile summary failed"
import gzip, json, re, sys
from scripts.bench import harness, host_trace, profile_trace
doc, kept = {"environment": harness.environment(), "variants": {}}, {}
for variant in ("synthetic", "gpu"):
    run = json.load(open(f"{sys.argv[1]}/profiled_{variant}.json"))["results"][0]
    workdir = re.search(r"--workdir=(\S+)", run["command"])[1]
    # One read of the trace for both summaries.
    events, steps = profile_trace.load_events(f"{workdir}/profile/process_0"), int(sys.argv[3])
    devices = profile_trace.device_summaries(events, steps, 30)
    host = profile_trace.jit_calls(events, steps)
    # The host's time in the train step's calls (its `launch`), by what it spends it on.
    launch = host_trace.breakdown(events, steps, call=host_trace.TRAIN_STEP_CALLS)
    doc["variants"][variant] = {"run": run, "devices": devices, "host": host,
                                "launch": launch}
    kept[variant] = {d: profile_trace.dump_kernels(k)
                     for d, k in profile_trace.device_kernels(events).items()}
    print(variant, {d: round(v["per_step"]["idle_us"] / 1e3, 1) for d, v in devices.items()},
          "ms idle a step")
json.dump(doc, open(sys.argv[2], "w"), indent=1)
with gzip.open(f"{sys.argv[2]}.kernels.json.gz", "wt") as f:  # the traced steps' kernels
    json.dump(kept, f)
PY
fi

if [[ "$mode" != trace ]]; then
python3 -m scripts.bench.gpu_decode report --stage="$runs/stage.json" --runs "$runs"/train_*.json \
  --out="$OUT/bench_gpu_decode.json" || echo "report failed"
fi

for log in "$runs"/*.log; do echo "== $log"; tail -n 40 "$log"; done >"$OUT/bench_gpu_decode.log"
echo "== summary"
if [[ "$mode" != trace ]]; then
  python3 -m scripts.render "$OUT/bench_gpu_decode.json" || tail -5 "$runs"/*.log
fi
python3 - "$OUT" <<'PY' || true
import json, os, sys
record = os.path.join(sys.argv[1], "bench_gpu_decode.json")
if os.path.exists(record):
    for run in json.load(open(record))["runs"]:
        for r in run["results"]:
            if "error" in r:
                print(f"failed: {run['gpus']} GPU(s), {run.get('processes', 1)} process(es), "
                      f"{r['variant']}: {r['log_tail'][-1:]}")
records = os.path.join(sys.argv[1], "gpu_decode_records.json")
if os.path.exists(records):
    print("records read alone:", {r["per_gpu"]: round(r["records_images_per_s"])
                                  for r in json.load(open(records))["results"]}, "images/s")
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
