#!/usr/bin/env bash
# The 2-GPU measurements of docs/benchmarks.md (issue: gradient communication), in two parts that
# each fit a 10-minute call; run from the repository root on a host with 2 GPUs:
#   OUT=/tmp/out bash scripts/bench_2gpu.sh steps     # scripts.bench.step: ResNet-50 @256 and @64, AlexNet-BN
#   OUT=/tmp/out bash scripts/bench_2gpu.sh comm      # all-reduce, profile, 2 processes x 1 GPU
#   OUT=/tmp/out bash scripts/bench_2gpu.sh small     # 64 images/GPU: 1 GPU, 1 process x 2, 2 x 1
#   OUT=/tmp/out bash scripts/bench_2gpu.sh pgle      # the default with profile-guided scheduling, and auto
#   OUT=/tmp/out bash scripts/bench_2gpu.sh overlap   # the overlap against none and the peer: 2 emulated
#                                                     # hosts x 1 GPU, and one process on 2 GPUs
#   OUT=/tmp/out bash scripts/bench_2gpu.sh ready     # the 32 MiB first bucket started where it is
#                                                     # ready, against the default and the peer
#   OUT=/tmp/out bash scripts/bench_2gpu.sh ready_trainer  # the same, the trainer itself (main)
#   OUT=/tmp/out bash scripts/bench_2gpu.sh told      # XLA told the hosts' GPUs and network, or
#   OUT=/tmp/out bash scripts/bench_2gpu.sh told_trainer  # not: the step; the trainer itself
#   OUT=/tmp/out bash scripts/bench_2gpu.sh nccl      # the told step with NCCL's GPU-side settings
#   OUT=/tmp/out bash scripts/bench_2gpu.sh told_half # XLA told half the network's bandwidth
#   OUT=/tmp/out bash scripts/bench_2gpu.sh told_half64  # at 64 images: x0.5, x1, x2, twice
#   OUT=/tmp/out bash scripts/bench_2gpu.sh fp8_told_half  # fp8 and bf16 told x1 and x0.5, at 256
#   OUT=/tmp/out bash scripts/bench_2gpu.sh told_scale_trainer  # the trainer told x0.5, x1, x2
#   OUT=/tmp/out bash scripts/bench_2gpu.sh graphs    # the trainer with and without convolutions
#                                                     # in command buffers (BATCHES, ROUNDS)
#   OUT=/tmp/out bash scripts/bench_2gpu.sh graphs_one_host  # the same as one process on both
#                                                     # GPUs (BATCHES)
#   OUT=/tmp/out bash scripts/bench_2gpu.sh after     # comm.pack_after_backward: fusion and rates
#   OUT=/tmp/out bash scripts/bench_2gpu.sh leaves    # comm.concatenate_buckets=False likewise
#   OUT=/tmp/out bash scripts/bench_2gpu.sh loop      # the trainer's loop against its own step
#                                                     # timed in-process, told alike, at 64
#   OUT=/tmp/out bash scripts/bench_2gpu.sh loop_ab   # the same in turns: step, trainer, step,
#                                                     # trainer (the link drifts within a call)
#   OUT=/tmp/out bash scripts/bench_2gpu.sh levers64  # at 64 images: an 8 MiB first bucket and
#                                                     # two all-reduces in flight, told
#   OUT=/tmp/out bash scripts/bench_2gpu.sh sharded   # the update sharded over the devices,
#                                                     # against the told default and the peer
#   OUT=/tmp/out bash scripts/bench_2gpu.sh sharded_held  # the same, its reduced buckets
#                                                     # held behind one barrier
#   OUT=/tmp/out bash scripts/bench_2gpu.sh fp8       # the fp8 wire (comm.dtype) against the
#                                                     # told default's bf16 and the peer
#   OUT=/tmp/out bash scripts/bench_2gpu.sh last      # a small last bucket against the told
#                                                     # default; fp8 in the default's buckets
#   OUT=/tmp/out bash scripts/bench_2gpu.sh last_apart  # the same, nothing combined
#   OUT=/tmp/out bash scripts/bench_2gpu.sh last_one_host  # the small last bucket and the
#                                                     # release on one host
#   OUT=/tmp/out bash scripts/bench_2gpu.sh release   # the update under the last bucket's
#                                                     # all-reduce, and fp8 between two hosts,
#                                                     # against the told step
#   OUT=/tmp/out bash scripts/bench_2gpu.sh nccl_compute  # the trainer traced beside one GPU
#                                                     # under NCCL settings that hold fewer SMs
#   OUT=/tmp/out bash scripts/bench_2gpu.sh vectors   # the trainer with the vectors in the last
#                                                     # bucket (the default) and without, traced
#   OUT=/tmp/out bash scripts/bench_2gpu.sh channels  # the trainer with NCCL's channels and with
#                                                     # one, traced (BATCHES, ROUNDS)
#   OUT=/tmp/out bash scripts/bench_2gpu.sh during_one_host  # one process on both GPUs packing
#                                                     # after backward (auto) and during it
#   OUT=/tmp/out bash scripts/bench_2gpu.sh defaults  # today's defaults and the plain peer
#                                                     # across 2 emulated hosts, traced
# Autotuning results are cached across the child processes (same kernels, same choices).
set -euo pipefail
export PYTHONUNBUFFERED=1 XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_per_fusion_autotune_cache_dir=/tmp/jia_jax_autotune"
peers=peer_ad_psum,peer_ad_psum_raveled,peer_concat_buckets
told_runs() {  # told_runs BATCHES HLO SCALE_RUN...: the told step (overlap_cap, or the
  # variants TOLD_VARIANTS names) across 2 emulated hosts x 1 GPU, XLA told SCALE times the
  # emulated bandwidth, one run per SCALE_RUN (e.g. 0.5_1), the first with the one-GPU rows; HLO
  # non-empty keeps each run's HLO.
  local batches=$1 hlo=$2 layouts=1x1,2x1 run
  shift 2
  for run in "$@"; do
    python3 -m scripts.bench.overlap --layouts=$layouts --batches="$batches" \
      --variants="${TOLD_VARIANTS:-overlap_cap}" --steps=10 --tell_xla_network=emulated \
      --told_bandwidth="${run%_*}" ${hlo:+--hlo_dir="$OUT/hlo_told_x$run"} \
      --out="$OUT/bench_told_${batches/,/_}_x$run.json"
    layouts=2x1
  done
}
told_rounds() {  # told_rounds NAME VARIANTS [FLAG...]: scripts.bench.overlap's VARIANTS (e.g.
  # the told default and the sharded steps of scripts/bench/sharded_step.py) on one GPU and
  # across 2 emulated hosts x 1 GPU at 64 and 256 images per GPU, told as the trainer is;
  # round-robin, two rounds; the FLAGs last.
  local name=$1 variants=$2
  shift 2
  python3 -m scripts.bench.overlap --layouts=1x1,2x1 --batches=64,256 --variants="$variants" \
    --steps=20 --rounds=2 --tell_xla_network=emulated "$@" \
    --out="$OUT/bench_overlap_${name}_2x1.json"
}
case "$1" in
  steps)
    python3 -m scripts.bench.step --models=resnet50 --meshes=1x1,1xn \
      --strategies=hierarchical,xla,$peers --budget_s=170 --variant_budget_s=0 --grace_s=20 \
      --out="$OUT/bench_step_2gpu_256.json"
    python3 -m scripts.bench.step --models=resnet50 --per_device_batch=64 --meshes=1x1,1xn \
      --strategies=hierarchical,xla,$peers --budget_s=150 --variant_budget_s=0 --grace_s=20 \
      --out="$OUT/bench_step_2gpu_64.json"
    python3 -m scripts.bench.step --models=alexnet_bn --meshes=1x1,1xn --strategies=hierarchical,xla \
      --budget_s=90 --variant_budget_s=0 --grace_s=20 --out="$OUT/bench_step_2gpu_alexnet.json"
    ;;
  comm)
    python3 -m scripts.bench.allreduce --sizes_mib=97.5 --bucket_mib=16 --dtypes=float32,bfloat16 \
      --strategies=xla,flat,hierarchical --repeats=7 --budget_s=100 --out="$OUT/bench_allreduce_2gpu.json"
    python3 -m scripts.bench.profile_step --trace_steps=5 --out="$OUT/profile_2gpu.json" \
      --cases=resnet50:1x1:xla:256,resnet50:1x2:hierarchical:256:bfloat16,resnet50:1x1:flat:256:bfloat16,resnet50:1x1:xla:64,resnet50:1x2:hierarchical:64:bfloat16
    mp=(--config=configs/resnet50_64k.py --config.data.name=synthetic --config.global_batch_size=512
      --config.total_steps=40 --config.log_every_steps=20 --config.optimizer.warmup_epochs=0
      --config.checkpoint_every_steps=1000 --config.eval_every_steps=1000)
    python3 -m scripts.bench.multiprocess --processes=2 --gpus=2 \
      --out="$OUT/bench_multiprocess_2gpu.json" -- "${mp[@]}" ||
      python3 -m scripts.bench.multiprocess --processes=2 --gpus=2 \
        --out="$OUT/bench_multiprocess_2gpu_nowatch.json" -- "${mp[@]}" \
        --config.distributed.watch_peers=false
    ;;
  small)
    # One process per GPU, as on a cluster: at 64 images/GPU one process launching for two GPUs
    # leaves them idle (the profile's idle time); the trainer's own log gives images/s.
    small=(--config=configs/resnet50_64k.py --config.data.name=synthetic --config.microbatch_size=64
      --config.total_steps=80 --config.log_every_steps=40 --config.optimizer.warmup_epochs=0
      --config.checkpoint_every_steps=1000 --config.eval_every_steps=1000)
    CUDA_VISIBLE_DEVICES=0 python3 -m jia_jax.main "${small[@]}" --config.global_batch_size=64 \
      --workdir=/tmp/jia_jax_1gpu_64 2>&1 | tee "$OUT/main_1gpu_64.log" | grep "step 80/"
    python3 -m scripts.bench.multiprocess --processes=2 --gpus=2 \
      --out="$OUT/bench_multiprocess_2gpu_64.json" -- "${small[@]}" --config.global_batch_size=128
    ;;
  pgle)
    # Not yet run. XLA waits for each early all-reduce right after starting it (docs/benchmarks.md,
    # profile): with measured costs its scheduler may overlap more. PGLE needs the jit path.
    for batch in 256 64; do
      python3 -m scripts.bench.step --models=resnet50 --per_device_batch=$batch --meshes=1x1,1xn \
        --strategies=hierarchical,auto --budget_s=120 --variant_budget_s=0 --grace_s=20 \
        --dispatch=jit --out="$OUT/bench_step_2gpu_jit_$batch.json"
      JAX_ENABLE_PGLE=true JAX_PGLE_PROFILING_RUNS=3 python3 -m scripts.bench.step --models=resnet50 \
        --per_device_batch=$batch --meshes=1x1,1xn --strategies=hierarchical --warmup_steps=8 \
        --budget_s=120 --variant_budget_s=0 --grace_s=20 --dispatch=jit \
        --out="$OUT/bench_step_2gpu_pgle_$batch.json"
    done
    ;;
  overlap)
    # The default (overlap), no overlap and the plain peer across 2 emulated hosts, and one
    # process on both GPUs (docs/benchmarks.md, "Is the gradient all-reduce hidden under
    # backward?"); stopped at 9 minutes with the rows it has.
    python3 -m scripts.bench.overlap --layouts=1x1,2x1,1x2 --batches=256,64 \
      --variants=overlap,no_overlap,peer \
      --layout_variants='{"1x2": ["overlap", "no_overlap"]}' \
      --budget_s=540 --out="$OUT/bench_overlap_2gpu.json"
    ;;
  ready)
    # `comm.first_bucket_bytes` 32 MiB with `comm.start_when_ready` (docs/benchmarks.md, "Does a
    # larger first bucket, started where it is ready, hide the wire?") against the default and
    # the peer as 2 emulated hosts x 1 GPU, and in one process on both GPUs (NVLink).
    python3 -m scripts.bench.overlap --layouts=1x1,2x1,1x2 --batches=256,64 \
      --variants=overlap,first32_ready,peer --steps=10 --rounds=2 \
      --layout_variants='{"1x2": ["overlap", "first32_ready"]}' \
      --budget_s=540 --out="$OUT/bench_overlap_ready_2gpu.json"
    ;;
  ready_trainer)
    # The trainer's own logged rate (jia_jax.main through launch_local.sh --hosts 2 1), default
    # and with the two settings, against one GPU; and the plain peer in the same call.
    python3 -m scripts.bench.hosts --hosts=2 --gpus_per_host=1 --batches=256,64 \
      --strategies=default --profile_steps=3 --profile_strategies=default --peer \
      --row_variant="--config.comm.first_bucket_bytes=33554432 --config.comm.start_when_ready=True" \
      --out="$OUT/bench_hosts_ready_2gpu.json"
    ;;
  told)
    # XLA's latency estimator told the emulated hosts' GPUs and network (`comm.tell_xla_network`,
    # jia_jax/xla_network.py) or not: the default config's step as 2 emulated hosts x 1 GPU
    # against one GPU, in runs that alternate (XLA reads it once a process; the link drifts).
    python3 -m scripts.bench.overlap --layouts=1x1,2x1 --batches=256,64 --variants=overlap \
      --steps=10 --hlo_dir="$OUT/hlo_untold_1" --out="$OUT/bench_overlap_untold_1.json"
    for run in emulated_1 untold_2 emulated_2; do
      told=${run%_*}
      python3 -m scripts.bench.overlap --layouts=2x1 --batches=256,64 --variants=overlap \
        --steps=10 --tell_xla_network="${told/untold/}" --hlo_dir="$OUT/hlo_$run" \
        --out="$OUT/bench_overlap_$run.json"
    done
    ;;
  told_trainer)
    # The same, the trainer itself (jia_jax.main through launch_local.sh --hosts 2 1, its logged
    # rate) with `comm.tell_xla_network` (the default) and without, against one GPU and the peer.
    python3 -m scripts.bench.hosts --hosts=2 --gpus_per_host=1 --batches=256,64 \
      --strategies=default --peer --row_variant="--config.comm.tell_xla_network=False" \
      --out="$OUT/bench_hosts_told_2gpu.json"
    ;;
  nccl)
    # The told step with its buckets apart, under other NCCL settings: larger staging buffers
    # (the emulated wire as it is, 4 socket threads x 4 sockets), and more channels, whose CTAs
    # copy each chunk to and from host memory while backward's kernels hold the SMs (each channel
    # has its own sockets, a wider wire: a diagnostic, not a setting). Runs alternate (NCCL reads
    # its environment once a process; the link drifts).
    wire='"NCCL_SOCKET_NTHREADS": "4", "NCCL_NSOCKS_PERTHREAD": "4"'
    python3 -m scripts.bench.overlap --layouts=1x1,2x1 --batches=256,64 --variants=overlap_cap \
      --steps=10 --tell_xla_network=emulated --nccl="{$wire}" --out="$OUT/bench_nccl_base_1.json"
    for run in buffsize_1 ctas_1 base_2; do
      case ${run%_*} in
        base) extra="" ;;
        buffsize) extra=', "NCCL_BUFFSIZE": "16777216"' ;;
        ctas) extra=', "NCCL_MIN_CTAS": "4", "NCCL_MIN_NCHANNELS": "4"' ;;
      esac
      python3 -m scripts.bench.overlap --layouts=2x1 --batches=256,64 --variants=overlap_cap \
        --steps=10 --tell_xla_network=emulated --nccl="{$wire$extra}" \
        --out="$OUT/bench_nccl_$run.json"
    done
    ;;
  told_half)
    # The told step (buckets apart, as the trainer compiles it) with XLA told the emulated
    # network's bandwidth, or half of it: about what the wire moved beside backward's kernels in
    # the profile, so that XLA may put more of backward between each bucket's start and its done
    # (it keeps one all-reduce in flight). Runs alternate (XLA reads it once a process).
    told_runs 256,64 hlo 1_1 0.5_1 1_2 0.5_2
    ;;
  told_half64)
    # The same at 64 images per GPU only, where told half won 8.6% in the mean, as much as runs
    # of one setting differed; and told twice the bandwidth, which places each done earlier
    # (the traced told step's wire sat idle between buckets). Six runs that alternate the three.
    told_runs 64 "" 1_1 0.5_1 2_1 1_2 0.5_2 2_2
    ;;
  fp8_told_half)
    # The fp8 wire in the default's buckets (told_fp8) against the told bf16 step, XLA told the
    # network's bandwidth or half of it, at 256 images per GPU: told the full bandwidth XLA
    # started the fp8 buckets later in backward than bf16's (it starts a collective only as
    # early as its estimate needs, and fp8 has half the bytes). Runs alternate.
    TOLD_VARIANTS=told_fp8,told told_runs 256 hlo 1_1 0.5_1 1_2 0.5_2
    ;;
  told_scale_trainer)
    # The trainer itself (its logged rate, 2 emulated hosts x 1 GPU against one GPU) told the
    # network's bandwidth, half of it and twice it (`comm.told_bandwidth_scale`).
    python3 -m scripts.bench.hosts --hosts=2 --gpus_per_host=1 --batches=256,64 \
      --strategies=default --row_variant="--config.comm.told_bandwidth_scale=0.5" \
      --row_variant="--config.comm.told_bandwidth_scale=2" \
      --out="$OUT/bench_hosts_told_scale_2gpu.json"
    ;;
  graphs)
    # The trainer (its logged rate, 2 emulated hosts x 1 GPU against one GPU, each round its own)
    # with its convolutions in XLA's command buffers (launch.convolution_graphs, the default) and
    # without, at BATCHES images per GPU (64 unless set), ROUNDS rounds (2 unless set), the plain
    # peer beside.
    python3 -m scripts.bench.hosts --hosts=2 --gpus_per_host=1 --batches="${BATCHES:-64}" \
      --strategies=default --rounds="${ROUNDS:-2}" --peer \
      --row_variant="--config.launch.convolution_graphs=never" \
      --out="$OUT/bench_hosts_graphs_2x1.json"
    ;;
  nccl_compute)
    # Do NCCL's kernels slow the step's compute across hosts by the SMs they hold? The trainer
    # across 2 emulated hosts x 1 GPU traced beside one GPU, at BATCHES images per GPU (256
    # unless set), ROUNDS rounds (1 unless set): the default, the default with NCCL's log of its
    # set-up written beside the results (how many channels it opens), one channel, and fewer
    # threads a channel. The rows' compute ms (`#accounting`) come from traces, whatever the
    # link does meanwhile.
    python3 -m scripts.bench.hosts --hosts=2 --gpus_per_host=1 --batches="${BATCHES:-256}" \
      --profile_steps=3 --rounds="${ROUNDS:-1}" \
      --row_variant="NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT NCCL_DEBUG_FILE=$OUT/nccl.%h.%p.log" \
      --row_variant="NCCL_MAX_NCHANNELS=1" --row_variant="NCCL_NTHREADS=128" \
      --out="$OUT/bench_hosts_nccl_compute_2x1.json"
    ;;
  vectors)
    # `comm.vectors_last` (the default) against the vectors packed among the kernels, across 2
    # emulated hosts x 1 GPU at BATCHES images per GPU (256,64 unless set), each traced beside
    # one GPU: the rows' compute ms (`#accounting`) and kernel time by kind say whether
    # BatchNorm's backward is fused as on one GPU again.
    python3 -m scripts.bench.hosts --hosts=2 --gpus_per_host=1 --batches="${BATCHES:-256,64}" \
      --profile_steps=3 --rounds="${ROUNDS:-1}" --row_variant="--config.comm.vectors_last=false" \
      --out="$OUT/bench_hosts_vectors_2x1.json"
    ;;
  channels)
    # NCCL's channels across 2 emulated hosts x 1 GPU: its choice (2 over the sockets) against
    # one, in turns, ROUNDS rounds (2 unless set) at BATCHES images per GPU (256 unless set;
    # about 7 minutes at 256), each row traced beside one GPU (`#accounting`). One channel won
    # in some calls and lost in others (docs/benchmarks.md, "Do one NCCL channel or a larger
    # first bucket help today's defaults?").
    python3 -m scripts.bench.hosts --hosts=2 --gpus_per_host=1 --batches="${BATCHES:-256}" \
      --profile_steps=3 --rounds="${ROUNDS:-2}" --row_variant="NCCL_MAX_NCHANNELS=1" \
      --out="$OUT/bench_hosts_channels_2x1.json"
    ;;
  during_one_host)
    # With the vectors last (`comm.vectors_last`), does packing during backward still lose in one
    # process on both GPUs? `comm.pack_after_backward`'s "auto" (after, on one host) against
    # "never" (during, with the 64K config's last bucket and release), at BATCHES images per GPU
    # (64,256 unless set), against one GPU.
    python3 -m scripts.bench.hosts --hosts=1 --gpus_per_host=2 --batches="${BATCHES:-64,256}" \
      --profile_steps=0 --row_variant="--config.comm.pack_after_backward=never" \
      --out="$OUT/bench_hosts_during_1x2.json"
    ;;
  defaults)
    # Today's defaults across 2 emulated hosts x 1 GPU against one GPU, with the plain peer timed
    # in-process in the same call, at BATCHES images per GPU (256,64 unless set; about 9
    # minutes), each row traced for 5 steps: `#accounting` gives the exposed communication over
    # the 4 after the first (`steady`) beside that of all 5.
    python3 -m scripts.bench.hosts --hosts=2 --gpus_per_host=1 --batches="${BATCHES:-256,64}" \
      --profile_steps=5 --peer --out="$OUT/bench_hosts_defaults_2x1.json"
    ;;
  graphs_one_host)
    # The same as one process driving both GPUs (NVLink; launch_local.sh --hosts 1 2), against
    # one GPU, at BATCHES images per GPU (64,256 unless set; 64 alone took about 3 minutes).
    python3 -m scripts.bench.hosts --hosts=1 --gpus_per_host=2 --batches="${BATCHES:-64,256}" \
      --strategies=default --row_variant="--config.launch.convolution_graphs=never" \
      --out="$OUT/bench_hosts_graphs_1x2.json"
    ;;
  after)
    # `comm.pack_after_backward`: the default step's fusion kinds and rate in one process on both
    # GPUs (packed after backward there) against XLA's all-reduces (docs/benchmarks.md, "Does
    # packing the gradients change how XLA fuses backward?"); then, round-robin, the default
    # against packing during backward on 1 x 2, and against after backward on 2 emulated hosts x
    # 1 GPU (the default there: during), XLA told the network as the trainer tells it.
    python3 -m scripts.bench.pack_fusion --gpus=2 --batches=256,64 --variants=xla,flat \
      --out="$OUT/pack_fusion_2gpu.json"
    variants='{"1x2": ["overlap", "during_backward"], "2x1": ["overlap", "after_backward"]}'
    python3 -m scripts.bench.overlap --layouts=1x1,1x2,2x1 --batches=256,64 --variants=overlap \
      --layout_variants="$variants" \
      --steps=10 --rounds=3 --tell_xla_network=emulated --budget_s=380 \
      --out="$OUT/bench_overlap_after_2gpu.json"
    ;;
  leaves)
    # `comm.concatenate_buckets=False`: whether buckets sent as their leaves keep XLA's fusion of
    # BatchNorm's backward while they leave during backward (one process on both GPUs, packed
    # during backward as across hosts), then its rate across 2 emulated hosts x 1 GPU against the
    # default, XLA told the network as the trainer tells it; round-robin.
    python3 -m scripts.bench.pack_fusion --gpus=2 --batches=256,64 \
      --variants=xla,flat_packed,flat_leaves --out="$OUT/pack_fusion_leaves_2gpu.json"
    python3 -m scripts.bench.overlap --layouts=1x1,2x1 --batches=256,64 --variants=overlap \
      --layout_variants='{"2x1": ["overlap", "leaves"]}' --steps=10 --rounds=3 \
      --tell_xla_network=emulated \
      --budget_s=330 --out="$OUT/bench_overlap_leaves_2x1.json"
    ;;
  loop)
    # Across 2 emulated hosts x 1 GPU the trainer's logged rate lost to the in-process peer where
    # in-process the told step beat it (docs/benchmarks.md, "Where does the trainer stand across
    # hosts"): the trainer (with its peer watch and without) against the step it compiles
    # (overlap_cap) and the peer, both timed in-process and told as the trainer is, one call;
    # at 64 images per GPU only, where the gap was (both batches take longer than a call).
    python3 -m scripts.bench.hosts --hosts=2 --gpus_per_host=1 --batches=64 \
      --strategies=default --row_variant=--config.distributed.watch_peers=false \
      --in_process=overlap_cap,peer --in_process_network=emulated \
      --out="$OUT/bench_hosts_loop_2gpu.json"
    ;;
  loop_ab)
    # In "loop" the trainer ran before its step each time, and lost to it by 10 to 26% while the
    # trainer's own logged intervals swung by as much: the two in turns, twice, at 64 images per
    # GPU, the step's one-GPU row in the first turn only (the trainer's has its own each turn).
    # The step is also timed as the loop runs it (--loop_timing: its stop flags, its metrics
    # fetched two steps late): whether the loop's way of calling the step is what costs.
    for turn in 1 2; do
      layouts=2x1
      if [[ $turn == 1 ]]; then layouts=1x1,2x1; fi
      python3 -m scripts.bench.overlap --layouts=$layouts --batches=64 --variants=overlap_cap \
        --steps=50 --loop_timing --tell_xla_network=emulated \
        --out="$OUT/bench_loop_ab_step_$turn.json"
      python3 -m scripts.bench.hosts --hosts=2 --gpus_per_host=1 --batches=64 \
        --strategies=default --steps=100 --out="$OUT/bench_loop_ab_trainer_$turn.json"
    done
    ;;
  levers64)
    # The told step at 64 images per GPU across 2 emulated hosts x 1 GPU against an 8 MiB first
    # bucket (ready after fewer convolutions) and two all-reduces in flight; round-robin, three
    # rounds (the link drifts within a call).
    python3 -m scripts.bench.overlap --layouts=1x1,2x1 --batches=64 \
      --layout_variants='{"2x1": ["overlap_cap", "first8_cap", "overlap_cap_ol2"]}' \
      --steps=10 --rounds=3 --tell_xla_network=emulated --budget_s=500 \
      --out="$OUT/bench_overlap_levers64_2x1.json"
    ;;
  fp8)
    # Half the gradient bytes: each bucket's mean as fp8 chunks (jia_jax/fp8_wire.py), with each
    # step's optimized HLO kept (where XLA placed the all-to-alls and all-gathers).
    told_rounds fp8 overlap_cap,fp8_cap,peer --budget_s=540 --hlo_dir="$OUT/hlo_fp8"
    ;;
  last)
    # A small last bucket (comm.last_bucket_bytes) against the told default, and the fp8 wire
    # in the default's buckets (8 MiB of fp8 values), with each step's optimized HLO kept.
    told_rounds last overlap_cap,last512k_cap,last2mib_cap,fp8_8mib_cap --budget_s=540 \
      --hlo_dir="$OUT/hlo_last"
    ;;
  release)
    # The update of the buckets before the last under the last bucket's all-reduce
    # (comm.release_before_last), and the fp8 wire's one all-gather a bucket between the two
    # hosts, against the trainer's told step and the plain peer.
    told_rounds release told,told_release,told_fp8,peer --budget_s=540 \
      --hlo_dir="$OUT/hlo_release"
    ;;
  last_one_host)
    # The 64K config's small last bucket and release before it inside one host (one process on
    # both GPUs, buckets packed after backward): against the plan without either, in turns.
    python3 -m scripts.bench.overlap --layouts=1x1,1x2 --batches=256,64 \
      --variants=overlap,no_last_release --steps=20 --rounds=2 --budget_s=300 \
      --out="$OUT/bench_overlap_last_1x2.json"
    ;;
  last_apart)
    # The same, nothing combined (combining capped at 16 MiB joined the small last bucket to the
    # one before it): the told default, uncombined, and both last buckets uncombined.
    told_rounds last_apart overlap_cap,overlap_uncombined,last512k_uncombined,last2mib_uncombined \
      --budget_s=540 --hlo_dir="$OUT/hlo_last_apart"
    ;;
  sharded)
    # The update sharded over the devices (half the gradient bytes under backward, the weights'
    # half under the next forward) against the told default and the plain peer.
    told_rounds sharded overlap_cap,sharded_cap,peer --budget_s=540
    ;;
  sharded_apart)
    # The same with no reduce-scatters combined (the cap let XLA pair them), also with XLA's
    # speed-of-light estimator off; each sharded step's optimized HLO kept.
    told_rounds sharded_apart overlap_cap,sharded_apart,sharded_apart_nosol --budget_s=540 \
      --hlo_dir="$OUT/hlo"
    ;;
  sharded_slow)
    # Told half the network's bandwidth, as both steps are: whether XLA then starts the
    # reduce-scatters earlier in backward.
    told_rounds sharded_slow overlap_cap,sharded_apart --budget_s=500 --told_bandwidth=0.5
    ;;
  sharded_after2)
    # Only the buckets after the first two sharded, at 64 images per GPU against the told
    # default, in turns (no one-GPU row: compare the two; the later flags win).
    told_rounds sharded_after2 overlap_cap,sharded_after2 --layouts=2x1 --batches=64 \
      --budget_s=150
    ;;
  sharded_held)
    # The sharded step with its reduced buckets held behind one barrier, as the trainer's are,
    # all sharded and the first two all-reduced, against the told default.
    told_rounds sharded_held overlap_cap,sharded_held,sharded_after2_held --budget_s=540 \
      --hlo_dir="$OUT/hlo"
    ;;
  *) echo "usage: $0 steps|comm|small|pgle|overlap|ready|ready_trainer|told|told_trainer|nccl" \
       "|told_half|told_half64|told_scale_trainer|graphs|graphs_one_host|after|leaves|loop|loop_ab|levers64" \
       "|sharded|sharded_apart|sharded_slow|sharded_after2|sharded_held|fp8" >&2
     exit 2 ;;
esac
