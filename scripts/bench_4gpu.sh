#!/usr/bin/env bash
# The 4-GPU measurements of docs/benchmarks.md ("Across hosts", "One host"), in parts that each fit
# a 10-minute call; run from the repository root on a host with 4 GPUs:
#   OUT=/tmp/out bash scripts/bench_4gpu.sh link      # the emulated network; the peer-watch crash
#   OUT=/tmp/out bash scripts/bench_4gpu.sh sigkill   # a killed process across emulated hosts
#   OUT=/tmp/out bash scripts/bench_4gpu.sh hosts256  # 2 emulated hosts x 2 GPUs @256 vs one GPU
#   OUT=/tmp/out bash scripts/bench_4gpu.sh hosts64   # the same @64
#   OUT=/tmp/out bash scripts/bench_4gpu.sh plans256  # every strategy and bucket size, 2 x 2 @256,
#   OUT=/tmp/out bash scripts/bench_4gpu.sh plans64   # and @64: the step in-process (bench.overlap)
#   OUT=/tmp/out bash scripts/bench_4gpu.sh told      # 2 x 2 with XLA told the hosts and network
#   OUT=/tmp/out bash scripts/bench_4gpu.sh told_trainer  # the same, the trainer itself (main)
#   OUT=/tmp/out bash scripts/bench_4gpu.sh after     # comm.pack_after_backward: 1x4 and 2x2
#   OUT=/tmp/out bash scripts/bench_4gpu.sh peers     # the default against the peers, 1 x 4
# Autotuning results are cached across the child processes (same kernels, same choices).
set -euo pipefail
export PYTHONUNBUFFERED=1 XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_per_fusion_autotune_cache_dir=/tmp/jia_jax_autotune"
overrides=(--config.data.name=synthetic --config.optimizer.warmup_epochs=0 --config.eval_every_steps=100000)
case "$1" in
  link)
    # Four sizes: scripts/calibrate_comm.py fits each level's latency and bandwidth from them.
    python3 -m scripts.bench.link --size_mib=0.25,4,32,97.5 --out="$OUT/bench_link_4gpu.json"
    ;;
  sigkill)
    # The default config on 2 emulated hosts; process 1 is killed once step 60 is logged.
    workdir=$(mktemp -d)
    log="$OUT/sigkill_2x2.log"
    bash scripts/launch_local.sh --hosts 2 2 configs/resnet50_64k.py "$workdir" "${overrides[@]}" \
      --config.global_batch_size=1024 --config.total_steps=2000 --config.checkpoint_every_steps=40 \
      --config.log_every_steps=20 >"$log" 2>&1 &
    launcher=$!
    until grep -q "step  *60/" "$log"; do
      kill -0 "$launcher" 2>/dev/null || { echo "the run ended before step 60" >&2; tail "$log"; exit 1; }
      sleep 0.2
    done
    victim=$(pgrep -f "distributed.process_id=1 " | head -1)
    killed=$SECONDS
    kill -9 "$victim"
    status=0
    wait "$launcher" || status=$?
    echo "killed process 1 (pid $victim); launcher exit status $status after $((SECONDS - killed)) s" | tee -a "$log"
    ;;
  hosts256)
    python3 -m scripts.bench.hosts --batches=256 --strategies=default,flat,xla --steps=200 \
      --log_every=20 --profile_steps=3 --profile_strategies=default,flat --out="$OUT/bench_hosts_256.json"
    ;;
  hosts64)
    python3 -m scripts.bench.hosts --batches=64 --strategies=default,flat,xla --steps=200 \
      --log_every=20 --profile_steps=3 --profile_strategies=default,flat --out="$OUT/bench_hosts_64.json"
    ;;
  plans256|plans64)
    # One GPU, then 2 emulated hosts x 2 GPUs: the default (flat, 16 MiB), the other strategies,
    # 4 and 64 MiB buckets and the plain peer; stopped at 9 minutes with the rows it has.
    python3 -m scripts.bench.overlap --layouts=1x1,2x2 --batches="${1#plans}" --budget_s=540 \
      --variants=overlap,hierarchical,hybrid,xla,auto,overlap_4mib,overlap_64mib,peer \
      --out="$OUT/bench_plans_2x2_${1#plans}.json"
    ;;
  told)
    # The default's step untold, against one GPU; then told the emulated hosts (2 GPUs each) and
    # network (`comm.tell_xla_network`: XLA reads it once a process), its buckets combined as XLA
    # likes or kept apart (`overlap_cap`, what the config option compiles), and hierarchical,
    # round-robin over two rounds so the variants share the link's drift.
    python3 -m scripts.bench.overlap --layouts=1x1,2x2 --batches=256,64 --variants=overlap \
      --steps=10 --budget_s=240 --out="$OUT/bench_told_2x2_untold.json"
    python3 -m scripts.bench.overlap --layouts=2x2 --batches=256,64 --rounds=2 --steps=10 \
      --variants=overlap,overlap_cap,hierarchical --tell_xla_network=emulated --budget_s=300 \
      --out="$OUT/bench_told_2x2_told.json"
    ;;
  told_trainer)
    # The trainer's own logged rate (jia_jax.main through launch_local.sh --hosts 2 2) with
    # `comm.tell_xla_network` (the default) and without, against one GPU.
    python3 -m scripts.bench.hosts --hosts=2 --gpus_per_host=2 --batches=256,64 \
      --strategies=default --row_variant="--config.comm.tell_xla_network=False" \
      --out="$OUT/bench_hosts_told_2x2.json"
    ;;
  after)
    # `comm.pack_after_backward` against the default ("auto": after backward on one node, during
    # it across nodes) and, in one process, XLA's all-reduces; 2 emulated hosts x 2 GPUs told the
    # network as the trainer tells it, also with `comm.concatenate_buckets=False` (`leaves`);
    # round-robin, stopped at 9 minutes.
    variants='{"1x4": ["overlap", "during_backward", "xla"],
      "2x2": ["overlap", "after_backward", "leaves"]}'
    python3 -m scripts.bench.overlap --layouts=1x1,1x4,2x2 --batches=256,64 \
      --variants=overlap --layout_variants="$variants" \
      --steps=10 --rounds=2 --tell_xla_network=emulated --budget_s=540 \
      --out="$OUT/bench_overlap_after_4gpu.json"
    ;;
  peers)
    # One process on the four GPUs: the default (`flat`, packed after backward there) against
    # XLA's all-reduces and the plain peers, at 256 then 64 images a GPU.
    for batch in 256 64; do
      python3 -m scripts.bench.step --models=resnet50 --per_device_batch=$batch --meshes=1x1,1xn \
        --strategies=flat,xla,peer_ad_psum,peer_ad_psum_raveled,peer_concat_buckets \
        --budget_s=170 --variant_budget_s=0 --grace_s=15 \
        --out="$OUT/bench_step_peers_1x4_$batch.json"
    done
    ;;
  *) echo "usage: $0 link|sigkill|hosts256|hosts64|plans256|plans64|told|told_trainer|after" \
       "|peers" >&2
     exit 2 ;;
esac
