r"""Where the gradient all-reduce runs: the trainer's step with and without overlap, one run.

Each row is one (layout, per-device batch, variant) of the trainer's ResNet-50 64K step
(`scripts/bench/trainer_step.py`: synthetic data, LARS, bf16, the `flat` strategy's 16 MiB bf16
buckets)
timed in-process, synced and queued (`harness.time_train_step`); then three queued steps are traced
for the NCCL time no compute kernel overlaps (`exposed_comm_ms`), the idle time and each process's
collective kernels (`queued_collectives_ms`), and one synced step for a timeline of its kernels.
Layouts, `PROCESSESxGPUS`, each process on its own GPUs:

  * `1x1`: one GPU, the baseline of every efficiency in the run;
  * `2x1`: two processes that are two hosts to NCCL (`emulated_hosts`: sockets on loopback);
  * `1x2`: one process driving two GPUs (NVLink).

Variants (`VARIANTS`): the default config (`overlap`: each bucket's all-reduce awaited only after
backward, `allreduce.hold_until_all_reduced`), no overlap, other bucket sizes, the other
strategies (`hierarchical`, `hybrid`, `xla`, `auto`), the overlap compiled with XLA's
latency-hiding scheduler (also without its memory limit) and/or combining capped at the bucket
size (`overlap_lhs_nolimit_cap`: all three), XLA's speed-of-light latency estimator off, also
with the cap (`overlap_nosol`, `overlap_nosol_cap`), the overlap and the peer with JAX's
profile-guided latency estimator (`overlap_pgle`, `peer_pgle`), and `peer`: the trainer's
forward/backward and update with a plain reduction after backward (`peer_steps`'
`peer_wire_buckets`: leaves concatenated into buckets of the config's size in its wire dtype, one
psum each), and `sharded_*`: the update sharded over the devices
(`scripts/bench/sharded_step.py`: buckets reduce-scattered in backward, weights all-gathered
under the next forward), with combining capped at the bucket size as told (`sharded_cap`), with
no reduce-scatter combined (`sharded_apart`), also with the estimator off (`_nosol`), and
with only the buckets after the first two sharded (`sharded_after2`), and the last two with
the reduced buckets held behind one barrier as the trainer's are (`_held`).

  efficiency = images/s on the layout / (its GPUs x images/s of 1x1 at the same batch)

over the median queued step; `mean_efficiency` is the same over the mean step, which counts the
steps the link stalls, as a training run's rate does.

A process compiles every variant of a batch first, then times them in turn, `--rounds` times
(each round `--steps` synced and `--steps` queued steps of each variant, pooled): the emulated
link drifts within a call, and rows whose samples interleave see the same drift (PGLE variants,
whose estimator is a global JAX setting, are timed on their own). With `--loop_timing` each round
then also times `--steps` steps as `jia_jax.loop` runs them (`loop_images_per_s`): the step
compiled with its stop flags, its metrics fetched to host two steps late. Each step is compiled
as the trainer compiles it (`--convolution_graphs`, `launch.convolution_graphs`: on GPUs its
convolutions in command buffers, primed by one step compiled without), a variant's XLA options
in both compiles; rows record `convolution_graphs`.

With `--tell_xla_network=NETWORK` the processes of a layout of several hosts start with XLA's
latency estimator told their GPUs and that network's links (what `comm.tell_xla_network` sets
for the trainer, jia_jax/xla_network.py); XLA reads it once a process, so a run is told or not.
`--told_bandwidth=F` tells it F times the network's bandwidth instead.

Process 0 also records each collective's place in XLA's schedule (`schedule`): how many
convolutions run between its start and its done, and whether XLA made it synchronous. An `auto`
row records the plan its step resolved to (`resolved`: strategy, bucket, crossover).

  python -m scripts.bench.overlap --layouts=1x1,2x1 --batches=256,64 --out=/tmp/overlap.json

Four GPUs as two hosts of two, every strategy, stopped after 9 minutes with the rows it has:

  python -m scripts.bench.overlap --layouts=1x1,2x2 --batches=256,64 --budget_s=540 \
      --variants=overlap,hierarchical,hybrid,xla,auto,overlap_4mib,overlap_64mib,peer

On CPU (tiny model, gloo; no GPU figures):

  JAX_PLATFORMS=cpu python -m scripts.bench.overlap --layouts=1x1,2x1 --batches=2 --tiny \
      --variants=overlap,no_overlap,peer --steps=2 --out=/tmp/overlap.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from jia_jax import step_graphs, xla_network
from scripts.bench import emulated_hosts, harness

MIB = 1 << 20
_LHS = {"xla_gpu_enable_latency_hiding_scheduler": True}
# XLA combines collectives no further than the config's 16 MiB buckets: how the trainer compiled
# its told step until it stopped combining concatenated buckets (`train.step_compiler_options`);
# with the 64K config's small last bucket it joins the last two (the plan of `last2mib_cap`).
_CAP = {
    f"xla_gpu_{kind}_combine_threshold_bytes": 16 * MIB
    for kind in ("all_reduce", "reduce_scatter", "all_gather")
}
# No combining at all: each concatenated bucket stays one collective of its own, however small
# (capped at 16 MiB, XLA joined a small last bucket to the one before it).
_UNCOMBINED = {
    f"xla_gpu_{kind}_combine_threshold_bytes": 0
    for kind in ("all_reduce", "reduce_scatter", "all_gather")
}
_NO_SOL = {"xla_gpu_enable_analytical_sol_latency_estimator": False}
_OVERLAP_4 = {"xla_gpu_experimental_parallel_collective_overlap_limit": 4}
# The cap, and no reduce-scatter combined at all: XLA measures a reduce-scatter against the cap
# by its output, 1/n of a bucket, so the cap alone let it pair them.
_APART = {**_CAP, "xla_gpu_reduce_scatter_combine_threshold_bytes": 0}
# name -> config overrides, XLA options for the step's compilation under "xla", and "pgle" (the
# peer's reduction is chosen by name: `peer*`).
VARIANTS: dict[str, dict[str, Any]] = {
    "overlap": {},
    "no_overlap": {"comm.overlap": False},
    # The buckets packed once backward has ended, or as it produces them, whatever the mesh
    # (`comm.pack_after_backward`; "auto" packs after backward on one node, during it across).
    "after_backward": {"comm.pack_after_backward": "always"},
    "during_backward": {"comm.pack_after_backward": "never"},
    # Each bucket sent as its leaves, not concatenated (`comm.concatenate_buckets`).
    "leaves": {"comm.concatenate_buckets": False},
    "overlap_4mib": {"comm.bucket_bytes": 4 * MIB},
    "overlap_8mib": {"comm.bucket_bytes": 8 * MIB},
    "overlap_32mib": {"comm.bucket_bytes": 32 * MIB},
    # XLA's latency-hiding scheduler (off by default) and the combining cap, with the overlap.
    "overlap_lhs": {"xla": _LHS},
    "overlap_cap": {"xla": _CAP},
    "overlap_lhs_cap": {"xla": {**_LHS, **_CAP}},
    # The latency-hiding scheduler without its memory limit (by default 95% of 80% of the GPU's
    # memory): whether that limit is what keeps the weight gradients, hence the buckets, late.
    "overlap_lhs_nolimit": {"xla": {**_LHS, "xla_gpu_memory_limit_slop_factor": 10_000}},
    "overlap_lhs_nolimit_cap": {
        "xla": {**_LHS, **_CAP, "xla_gpu_memory_limit_slop_factor": 10_000}
    },
    # XLA's speed-of-light latency estimator off (enabled, it turns the latency-hiding scheduler
    # on for modules it supports, on Hopper and later): whether this XLA enables it by default,
    # as the LHS flag leaving the schedule unchanged suggests; without the LHS, XLA issues each
    # all-reduce right after its operand, so with the cap every bucket could leave on its own.
    # (The estimator's link options are a map that compile options cannot set: XLA_FLAGS can.)
    "overlap_nosol": {"xla": _NO_SOL},
    "overlap_nosol_cap": {"xla": {**_NO_SOL, **_CAP}},
    # With the estimator off and the cap, each bucket starts as soon as it is packed, but its done
    # sits right before the next bucket's start, so the compute stream waits for each bucket in
    # turn (bench_overlap_nosol_4xH200.json): more than one all-reduce in flight, with the
    # latency-hiding scheduler (whose async tracker allows one by default) left as XLA sets it, or
    # on explicitly. Measured: the raised limit left the schedule as it was
    # (bench_overlap_ol4_2xH200.json).
    "overlap_nosol_cap_ol4": {"xla": {**_NO_SOL, **_CAP, **_OVERLAP_4}},
    "overlap_nosol_cap_lhs_ol4": {"xla": {**_NO_SOL, **_CAP, **_OVERLAP_4, **_LHS}},
    "overlap_64mib": {"comm.bucket_bytes": 64 * MIB},
    # One larger first bucket (`comm.first_bucket_bytes`): the fc and layer4 gradients, which
    # backward produces in a burst, leave as one all-reduce instead of two queued back to back
    # (27 MiB: the two first 16 MiB buckets; 32 MiB also takes layer3's last block, leaving a
    # last bucket of 0.8M elements); as XLA schedules them, and starting where they are ready.
    "overlap_first32": {"comm.first_bucket_bytes": 32 * MIB},
    "overlap_first27_nosol_cap": {"comm.first_bucket_bytes": 27 * MIB, "xla": {**_NO_SOL, **_CAP}},
    "overlap_first32_nosol_cap": {"comm.first_bucket_bytes": 32 * MIB, "xla": {**_NO_SOL, **_CAP}},
    # The same through the config (`comm.start_when_ready` sets those XLA options on the step).
    "first32_ready": {"comm.first_bucket_bytes": 32 * MIB, "comm.start_when_ready": True},
    # The 32 MiB first bucket with combining capped at the bucket size, as the trainer compiles
    # its step where XLA is told the network.
    "first32_cap": {"comm.first_bucket_bytes": 32 * MIB, "xla": _CAP},
    # At 64 images per GPU the wire needs about half the one-GPU step, all of it after the first
    # bucket is ready, one all-reduce in flight (docs/benchmarks.md, "Where does the trainer
    # stand across hosts"): a smaller first bucket (the fc layer and the last convolutions'
    # gradients) that leaves earlier, and two all-reduces in flight, each as the trainer
    # compiles its step told.
    "first8_cap": {"comm.first_bucket_bytes": 8 * MIB, "xla": _CAP},
    "overlap_cap_ol2": {
        "xla": {**_CAP, "xla_gpu_experimental_parallel_collective_overlap_limit": 2}
    },
    # Half the gradient bytes: each bucket's mean sent as scaled fp8 chunks (`comm.dtype`,
    # jia_jax/fp8_wire.py: an all-to-all and an all-gather), as the trainer compiles its step told.
    "fp8_cap": {"comm.dtype": "float8_e4m3fn", "xla": _CAP},
    # The same buckets as bf16's 16 MiB ones (8 MiB of fp8 values): fewer bytes, same readiness.
    "fp8_8mib_cap": {"comm.dtype": "float8_e4m3fn", "comm.bucket_bytes": 8 * MIB, "xla": _CAP},
    # A small last bucket (`comm.last_bucket_bytes`): the stem's and the first stage's gradients
    # alone after backward, the second stage's leaving while the first stage's backward runs.
    "last512k_cap": {"comm.last_bucket_bytes": MIB // 2, "xla": _CAP},
    "last2mib_cap": {"comm.last_bucket_bytes": 2 * MIB, "xla": _CAP},
    "overlap_uncombined": {"comm.last_bucket_bytes": 0, "xla": _UNCOMBINED},
    # The trainer's step as it compiles it told: the config's buckets (its small last one
    # included), nothing combined.
    "told": {"xla": _UNCOMBINED},
    # The same with the buckets before the last released to the update once backward has packed
    # the last (`comm.release_before_last`): their update under the last bucket's all-reduce.
    "told_release": {"comm.release_before_last": True, "xla": _UNCOMBINED},
    # The fp8 wire in the default's buckets (8 MiB of fp8 values) as the trainer compiles it
    # told: between 2 hosts one all-gather a bucket (jia_jax/fp8_wire.py).
    "told_fp8": {"comm.dtype": "float8_e4m3fn", "comm.bucket_bytes": 8 * MIB, "xla": _UNCOMBINED},
    # Without the 64K config's small last bucket: on one host, where the buckets are packed after
    # backward, whether the extra all-reduce costs anything.
    "no_last": {"comm.last_bucket_bytes": 0},
    # Neither the small last bucket nor the release before it: the 64K config's step before both.
    "no_last_release": {"comm.last_bucket_bytes": 0, "comm.release_before_last": False},
    "last512k_uncombined": {"comm.last_bucket_bytes": MIB // 2, "xla": _UNCOMBINED},
    "last2mib_uncombined": {"comm.last_bucket_bytes": 2 * MIB, "xla": _UNCOMBINED},
    # The other strategies (jia_jax/allreduce.py), overlapped as the default is.
    "hierarchical": {"comm.strategy": "hierarchical"},
    "hybrid": {"comm.strategy": "hybrid"},
    "xla": {"comm.strategy": "xla"},
    "auto": {"comm.strategy": "auto", "comm.bucket_bytes": -1, "comm.hybrid_crossover_bytes": -1},
    "peer": {"comm.overlap": False},
    # The update sharded over the devices (`scripts/bench/sharded_step.py`): each bucket
    # reduce-scattered during backward, the weights all-gathered under the next forward; with
    # combining capped as the told trainer caps it.
    "sharded_cap": {"xla": _CAP},
    # The cap let XLA pair the reduce-scatters (bench_overlap_sharded_2x1_2xH200.json): none
    # combined (`_APART`); also with XLA's speed-of-light estimator off (each starts where ready).
    "sharded_apart": {"xla": _APART},
    "sharded_apart_nosol": {"xla": {**_APART, **_NO_SOL}},
    # XLA starts the all-reduces of the buckets backward fills first early, and those buckets
    # have most of backward to hide under; the later ones' reduce-scatters leave where the
    # all-reduces would, their halves returning under the next forward: the first two buckets
    # all-reduced and updated whole ("replicated"), the other two sharded.
    "sharded_after2": {"replicated": 2, "xla": _APART},
    # Without the trainer's barrier over the reduced buckets, XLA placed each bucket's
    # collective by where its readers were scheduled: the two all-reduces of `sharded_after2`,
    # read after the norms' all-reduce, went last (bench_overlap_sharded_after2_2x1_2xH200.json).
    # The same two with the reduced buckets held behind one barrier, as the trainer's are.
    "sharded_held": {"hold": True, "xla": _APART},
    "sharded_after2_held": {"replicated": 2, "hold": True, "xla": _APART},
    # With JAX's profile-guided latency estimator (`jax_enable_pgle`) and XLA's latency-hiding
    # scheduler: the jitted step runs `_PGLE_RUNS` times under the profiler, then is recompiled
    # with the measured op times, so the scheduler knows how long each all-reduce takes.
    "overlap_pgle": {"pgle": True},
    "peer_pgle": {"comm.overlap": False, "pgle": True},
}
_PGLE_RUNS = 3
_NOT_CONFIG = ("xla", "pgle", "replicated", "hold")
_ROW = "OVERLAP_ROW "


def schedule(hlo: str) -> list[dict[str, Any]]:
    """Each collective of the optimized entry computation, in schedule order: its operand bytes'
    shape, its position (line of the entry computation, the header being 0), the convolutions
    scheduled before its start and between its start and done, whether XLA runs it synchronously
    (`is_sync`), and `convolutions_until_ready`: the convolutions scheduled up to the last one its
    operands depend on (a start later than that waited for the scheduler, not for its data)."""
    entry = harness.entry_lines(hlo)
    convs = [i for i, line in enumerate(entry) if _CONVOLUTION in line]
    graph, conv_lines = _operand_graph(entry), set(convs)
    out, open_starts = [], {}
    for i, line in enumerate(entry):
        m = _INSTRUCTION.match(line)
        if not m or not m.group(3).startswith(_COLLECTIVES):
            continue
        name, shape, op, operands = m.groups()
        if op.endswith("-done"):
            # A done's operand is its start, which holds the collective's place and data; one
            # whose start was not read counts as synchronous where the done is.
            found = open_starts.pop(operands.split(",")[0].strip(), None)
            start, shape, sync, ready = found or (
                i, shape, True, _last_conv_ancestor(graph, name, conv_lines)
            )
            out.append(
                _collective(op[: -len("-done")], shape, start, i, sync, convs, len(entry), ready)
            )
            continue
        ready = _last_conv_ancestor(graph, name, conv_lines)
        if op.endswith("-start"):
            open_starts[name] = (i, shape, "\"is_sync\":true" in line, ready)
        else:
            out.append(_collective(op, shape, i, i, True, convs, len(entry), ready))
    return sorted(out, key=lambda c: c["start_index"])


def weight_gradient_places(hlo: str) -> list[int]:
    """Where XLA scheduled the weight-gradient convolutions (cuDNN's backward-filter calls) of
    the optimized entry computation: each one's index among all its convolutions, in order.
    Interleaved with the data-gradient ones, the buckets can fill as backward runs; all at the
    end, no bucket is ready before the last data-gradient convolution."""
    convs = [line for line in harness.entry_lines(hlo) if _CONVOLUTION in line]
    return [i for i, line in enumerate(convs) if "__cudnn$convBackwardFilter" in line]


# The collectives `schedule` reads: the fp8 wire's buckets leave as all-to-alls
# (jia_jax/fp8_wire.py), the sharded step's as reduce-scatters.
_COLLECTIVES = ("all-reduce", "reduce-scatter", "all-gather", "all-to-all")
# A cuDNN convolution of any kind (forward, backward data or filter, fused) in optimized HLO.
_CONVOLUTION = 'custom_call_target="__cudnn$conv'
_INSTRUCTION = re.compile(r"\s*(?:ROOT )?(\S+) = (.+?) ([\w-]+)\((.*?)\)")


def _operand_graph(entry: Sequence[str]) -> dict[str, tuple[int, list[str]]]:
    """Each instruction of the entry computation: its line and the names of its operands."""
    graph = {}
    for i, line in enumerate(entry):
        m = _INSTRUCTION.match(line)
        if m:
            # Names with or without XLA's '%'; other tokens (types, numbers) are not in the graph.
            graph[m.group(1)] = (i, re.findall(r"%?[\w.\-]+", m.group(4)))
    return graph


def conv_ancestors(graph, name: str, convs: set[int]) -> list[int]:
    """The lines of every convolution that `name` depends on (`_operand_graph`'s `graph`)."""
    seen, todo, found = set(), list(graph[name][1]), []
    while todo:
        operand = todo.pop()
        if operand in seen or operand not in graph:
            continue
        seen.add(operand)
        line, operands = graph[operand]
        if line in convs:
            found.append(line)
        todo.extend(operands)
    return sorted(found)


def _last_conv_ancestor(graph, name: str, convs: set[int]) -> int:
    """The line of the last convolution that `name` depends on, -1 for none."""
    return max(conv_ancestors(graph, name, convs), default=-1)


def _collective(op, shape, start, done, sync, convs, length, ready) -> dict[str, Any]:
    return {
        "op": op,
        "shape": shape[:80],
        "start_index": start,
        "done_index": done,
        "instructions": length,
        "convolutions_until_ready": sum(c <= ready for c in convs),
        "convolutions_before_start": sum(c < start for c in convs),
        "convolutions_between": sum(start < c < done for c in convs),
        "convolutions": len(convs),
        "sync": sync,
    }


def timeline(kernels: Sequence[Any]) -> dict[str, Any]:
    """One traced step's kernels, relative to its first: compute busy intervals (gaps under 20 us
    merged) and each collective kernel, in ms."""
    from scripts.bench import profile_trace

    t0 = min(k.start_us for k in kernels)
    compute = profile_trace.union(
        (k.start_us, k.end_us) for k in kernels if k.kind != "collective"
    )
    merged: list[list[float]] = []
    for a, b in compute:
        if merged and a - merged[-1][1] < 20:
            merged[-1][1] = b
        else:
            merged.append([a, b])
    ms = lambda x: round((x - t0) / 1000, 3)  # noqa: E731
    return {
        "compute_ms": [[ms(a), ms(b)] for a, b in merged],
        "collectives_ms": [
            [ms(k.start_us), ms(k.end_us)] for k in kernels if k.kind == "collective"
        ],
    }


def collective_spans(kernels: Sequence[Any]) -> list[list[float]]:
    """Each collective kernel of a trace, start and end in ms from the trace's first kernel: per
    process, the same collective lasts longer where that process reached it first (it waits for
    the others) or the wire was slow for all."""
    t0 = min(k.start_us for k in kernels)
    spans = sorted((k.start_us, k.end_us) for k in kernels if k.kind == "collective")
    return [[round((a - t0) / 1000, 3), round((b - t0) / 1000, 3)] for a, b in spans]


def _build(args: argparse.Namespace, variant: str, batch: int, processes: int, gpus: int):
    import jax

    from jia_jax import train
    from scripts.bench import peer_steps, sharded_step, trainer_step

    config = trainer_step.make_config(
        "resnet50",
        "flat",
        processes,
        gpus,
        per_device_batch_override=batch,
        **(dict(image_size=32, model_width=8, small_inputs=True) if args.tiny else {}),
    )
    if processes > 1:
        # Every process is a host of its own to NCCL (`emulated_hosts.run`), as with
        # `scripts/launch_local.sh --hosts`: 'auto' plans for the links fitted on such a machine.
        config.comm.network = "emulated"
    # What XLA is told, and its combining, are this script's to set (`--tell_xla_network`, the
    # variants' "xla" options), so that a variant compiles the same step told or not.
    config.comm.tell_xla_network = False
    for key, value in VARIANTS[variant].items():
        if key not in _NOT_CONFIG:
            section, field = key.split(".")
            config[section][field] = value
    setup = trainer_step.build_setup(config, jax.devices())
    parts = (setup["model"], setup["tx"], setup["schedule"], config, setup["mesh"])
    if variant.startswith("peer"):
        step = peer_steps.make_peer_step("peer_wire_buckets", *parts)
    elif variant.startswith("sharded"):
        params = jax.eval_shape(setup["init"]).params
        image_shape = setup["batch"]["image"].shape[1:]
        step, shard = sharded_step.make_sharded_step(
            setup["model"], setup["schedule"], config, setup["mesh"], params, image_shape,
            VARIANTS[variant].get("replicated", 0), VARIANTS[variant].get("hold", False),
        )
        init = setup["init"]
        setup = {**setup, "init": lambda: shard(init())}
    else:
        step = train.make_train_step(*parts)
    return step, setup, config


def _prepare(args, variant: str, batch: int, processes: int, gpus: int) -> dict[str, Any]:
    """One variant's step built, compiled and warmed up, for `_time_round` and `_row`; with
    `--loop_timing` (not for the peer or the sharded step, which take no stop flags) also
    compiled as the training loop calls it."""
    import jax

    from jia_jax import loop as loop_lib
    from jia_jax import train

    step, setup, config = _build(args, variant, batch, processes, gpus)
    state = setup["init"]()
    sharded = variant.startswith("sharded")  # its own plan, the config's explicit buckets
    resolved = {} if sharded else resolved_plan(config, setup, state.params)
    options = VARIANTS[variant].get("xla")
    start = time.perf_counter()
    compiled, state, graphs = step_graphs.compile_like_training(
        step.lower(state, setup["batch"]), args.convolution_graphs, state, setup["batch"],
        options=options)
    for _ in range(args.warmup_steps):
        state, _ = compiled(state, setup["batch"])
    jax.block_until_ready(state)
    compile_s = time.perf_counter() - start
    looped = None
    if args.loop_timing and not (sharded or variant.startswith("peer")):
        # The same step with the stop flags as an argument, as `jia_jax.loop` calls it.
        stop = train.stop_flags(setup["mesh"], False)
        looped_step, state, _ = step_graphs.compile_like_training(
            step.lower(state, setup["batch"], stop), args.convolution_graphs, state,
            setup["batch"], stop, options=options)
        looped = {"compiled": looped_step, "stop": stop, "lag": loop_lib.METRICS_LAG,
                  "samples": []}
    return {
        "variant": variant,
        "compiled": compiled,
        "looped": looped,
        "state": state,
        "batch": setup["batch"],
        "images": batch * processes * gpus,
        "synced": [],
        "queued": [],
        "fields": {
            "compile_s": compile_s,
            "convolution_graphs": graphs,
            **_plan_fields(variant, config, resolved, setup["mesh"]),
        },
    }


def _plan_fields(
    variant: str, config: Any, resolved: dict[str, Any], mesh: Any
) -> dict[str, Any]:
    """The plan a row ran: strategy (the peer's and the sharded step's by name), buckets (the
    last bucket and the release as the step applies them on `mesh`), and what 'auto' resolved
    to."""
    from jia_jax import train

    named = next((n for n in ("peer", "sharded") if variant.startswith(n)), None)
    last, release = train.late_buckets(config.comm, train.packs_after_backward(config.comm, mesh))
    return {
        "strategy": named or config.comm.strategy,
        "bucket_bytes": config.comm.bucket_bytes,
        "first_bucket_bytes": config.comm.first_bucket_bytes,
        "last_bucket_bytes": last,
        "release_before_last": release,
        **resolved,
    }


def _time_round(prepared: dict[str, Any], steps: int) -> None:
    """`steps` synced and `steps` queued steps of a prepared variant, added to its samples; with
    `--loop_timing` then `steps` as the training loop runs them."""
    compiled, batch = prepared["compiled"], prepared["batch"]
    state, synced = harness.time_steps(compiled, prepared["state"], batch, steps, queued=False)
    state, queued = harness.time_steps(compiled, state, batch, steps, queued=True)
    looped = prepared["looped"]
    if looped:
        state, samples = harness.time_loop(
            looped["compiled"], state, batch, looped["stop"], steps, looped["lag"]
        )
        looped["samples"] += samples
    prepared.update(state=state, synced=prepared["synced"] + synced,
                    queued=prepared["queued"] + queued)


def _row(prepared: dict[str, Any]) -> dict[str, Any]:
    """A prepared variant's row: rates over all its rounds' samples; on GPU the traced figures
    and (process 0) the collectives' place in XLA's schedule."""
    import jax

    row = harness.step_rates(prepared["images"], prepared["synced"], prepared["queued"])
    row.update(prepared["fields"])
    if prepared["looped"]:
        samples = prepared["looped"]["samples"]
        row.update(loop_samples_s=samples,
                   loop_images_per_s=prepared["images"] / statistics.mean(samples))
    if jax.default_backend() == "gpu":
        row.update(_traced(prepared["compiled"], prepared["state"], prepared["batch"]))
        if jax.process_index() == 0:
            row["schedule"] = schedule(prepared["compiled"].as_text())
    return row


def _measure_pgle(args, variant: str, batch: int, processes: int, gpus: int) -> dict[str, Any]:
    """A row with JAX's profile-guided latency estimator: the jit path (profiled runs, then the
    recompile with their times) timed on its own, never interleaved (the estimator is a global
    JAX setting)."""
    import jax

    step, setup, config = _build(args, variant, batch, processes, gpus)
    state = setup["init"]()
    resolved = resolved_plan(config, setup, state.params)
    start = time.perf_counter()
    jax.config.update("jax_enable_pgle", True)
    jax.config.update("jax_pgle_profiling_runs", _PGLE_RUNS)
    try:
        step = jax.jit(step.__wrapped__, donate_argnums=0, compiler_options=_LHS)
        for _ in range(_PGLE_RUNS + 2):
            state, _ = jax.block_until_ready(step(state, setup["batch"]))
        compile_s = time.perf_counter() - start
        state, synced, queued = harness.time_train_step(
            step, state, setup["batch"], args.steps, args.warmup_steps
        )
        row = harness.step_rates(batch * processes * gpus, synced, queued)
        if jax.default_backend() == "gpu":
            row.update(_traced(step, state, setup["batch"]))
    finally:
        jax.config.update("jax_enable_pgle", False)
    row.update(compile_s=compile_s, **_plan_fields(variant, config, resolved, setup["mesh"]))
    return row


def resolved_plan(config: Any, setup: dict[str, Any], params: Any) -> dict[str, Any]:
    """`{"resolved": strategy, bucket and crossover}` that `comm.strategy='auto'` (or a bucket or
    crossover of -1) resolved to in the step, as `train.make_train_step` resolves them; `{}` for
    explicit plans (the row's `strategy` and `bucket_bytes` are then the plan)."""
    from jia_jax import train

    comm = config.comm
    if comm.strategy != "auto" and -1 not in (comm.bucket_bytes, comm.hybrid_crossover_bytes):
        return {}
    image_shape = setup["batch"]["image"].shape[1:]
    plan = train.resolve_comm(comm, setup["model"], setup["mesh"], params, image_shape)
    keys = ("strategy", "bucket_bytes", "hybrid_crossover_bytes")
    return {"resolved": {k: plan[k] for k in keys}}


def _traced(compiled, state, batch: dict[str, Any]) -> dict[str, Any]:
    """Three queued steps traced for the exposed NCCL and idle time per step, and one synced
    step for a timeline of its kernels (GPU only)."""
    import jax

    from scripts.bench import profile_trace

    with tempfile.TemporaryDirectory() as queued_dir, tempfile.TemporaryDirectory() as one_dir:
        with jax.profiler.trace(queued_dir):
            state, _ = harness.time_steps(compiled, state, batch, 1, queued=True)
        with jax.profiler.trace(one_dir):
            state, _ = harness.time_steps(compiled, state, batch, 1, queued=False)
        queued_kernels = list(profile_trace.load_kernels(queued_dir).values())
        per_gpu = [profile_trace.summarize(k, steps=3) for k in queued_kernels]
        one = list(profile_trace.load_kernels(one_dir).values())[0]
    return {
        "exposed_comm_ms": statistics.mean(s["collective_exposed_us"] for s in per_gpu) / 1e3,
        "idle_ms": statistics.mean(s["idle_us"] for s in per_gpu) / 1e3,
        "timeline": timeline(one),
        "queued_collectives_ms": [collective_spans(k) for k in queued_kernels],
    }


def worker(args: argparse.Namespace) -> None:
    """One process of a layout: every (batch, variant) row, printed as a JSON line."""
    import jax

    processes, gpus = (int(x) for x in args.layout.split("x"))
    if processes > 1:
        jax.distributed.initialize(f"127.0.0.1:{args.port}", processes, args.process_id)

    def emit(row: dict[str, Any], variant: str, batch: int) -> None:
        row.update(variant=variant, per_device_batch=batch, process=jax.process_index(),
                   rounds=args.rounds)
        print(_ROW + json.dumps(row), flush=True)

    def guarded(fn, *fn_args):  # a variant XLA rejects loses only its row
        try:
            return fn(*fn_args)
        except Exception as e:  # noqa: BLE001
            return {"error": harness.error_text(e, tail=True)}

    for batch in args.batches:
        prepared = []
        for variant in args.variants if processes * gpus > 1 else ["overlap"]:
            if VARIANTS[variant].get("pgle", False):
                emit(guarded(_measure_pgle, args, variant, batch, processes, gpus), variant, batch)
                continue
            p = guarded(_prepare, args, variant, batch, processes, gpus)
            if "error" in p:
                emit(p, variant, batch)
                continue
            prepared.append(p)
            if args.hlo_dir and jax.process_index() == 0:
                os.makedirs(args.hlo_dir, exist_ok=True)
                path = f"{args.hlo_dir}/{args.layout}_{variant}_{batch}.hlo"
                with open(path, "w") as f:
                    f.write(p["compiled"].as_text())
        # Round-robin: the link drifts within a call, so every variant's samples span it alike.
        for r in range(args.rounds):
            kept = []
            for p in prepared:
                failed = guarded(_time_round, p, args.steps)
                if failed:
                    emit(failed, p["variant"], batch)
                elif r == args.rounds - 1:
                    emit(guarded(_row, p), p["variant"], batch)
                else:
                    kept.append(p)
            prepared = kept


def _layout_rows(
    args: argparse.Namespace, layout: str, deadline: float
) -> list[dict[str, Any]]:
    """Runs one layout's processes and merges their rows (rates of process 0, trace figures
    averaged over the processes)."""
    processes, gpus = (int(x) for x in layout.split("x"))
    cpu = os.environ.get("JAX_PLATFORMS") == "cpu"
    env = (
        {"XLA_FLAGS": f"--xla_force_host_platform_device_count={gpus}",
         "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo"} if cpu else {}
    )
    told = args.tell_xla_network if processes > 1 else ""  # the network XLA's estimator is told
    if told:
        link = xla_network.told_link(told, args.told_bandwidth)
        xla_flags = env.get("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))
        env["XLA_FLAGS"] = xla_network.with_estimator(xla_flags, gpus, link)
        if args.told_bandwidth != 1:
            told = f"{told} x{args.told_bandwidth:g} bandwidth"
    flags = [f"--{k}={getattr(args, k)}"
             for k in ("steps", "warmup_steps", "rounds", "convolution_graphs")]
    flags += ["--loop_timing"] * args.loop_timing
    variants = args.layout_variants.get(layout, args.variants)
    flags += [f"--batches={','.join(map(str, args.batches))}", f"--variants={','.join(variants)}"]
    flags += ["--tiny"] * args.tiny
    flags += [f"--hlo_dir={args.hlo_dir}"] * bool(args.hlo_dir)

    def module_args(i: int, port: int) -> list[str]:
        return ["scripts.bench.overlap", "--worker", f"--layout={layout}", f"--port={port}",
                f"--process_id={i}", *flags]

    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        timeout = min(args.timeout_s, deadline - time.monotonic())
        codes, logs = emulated_hosts.run(module_args, processes, gpus, args.nccl, timeout)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    per_process = [
        [json.loads(line[len(_ROW):]) for line in log.splitlines() if line.startswith(_ROW)]
        for log in logs
    ]
    rows = []
    for i, first in enumerate(per_process[0]):
        row = {"layout": layout, "hosts": processes, "gpus_per_host": gpus, **first}
        if told:
            row["told"] = told
        if "error" not in row and "exposed_comm_ms" in row:
            others = [p[i] for p in per_process[1:] if i < len(p) and "exposed_comm_ms" in p[i]]
            for key in ("exposed_comm_ms", "idle_ms"):
                row[key] = statistics.mean([first[key], *(o[key] for o in others)])
            if "queued_collectives_ms" in first:  # per process: which one waited for which
                row["queued_collectives_ms"] = [
                    first["queued_collectives_ms"],
                    *(o["queued_collectives_ms"] for o in others),
                ]
        rows.append(row)
    if len(rows) < len(args.batches) * (len(variants) if processes * gpus > 1 else 1):
        rows.append({"layout": layout, "error": f"exit codes {codes}", "log_tail": logs[0][-3000:]})
    return rows


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layouts", type=harness.strings, default=["1x1", "2x1"])
    parser.add_argument(
        "--batches", type=lambda s: [int(x) for x in s.split(",")], default=[256, 64]
    )
    parser.add_argument("--variants", type=harness.strings, default=["overlap", "no_overlap", "peer"])
    parser.add_argument(
        "--layout_variants", type=json.loads, default={},
        help='JSON: variants of some layouts instead of --variants, e.g. {"1x2": ["overlap"]}',
    )
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument(
        "--rounds", type=int, default=1,
        help="timing rounds: every variant of a batch is compiled first, then each round times "
        "`--steps` synced and queued steps of each in turn; the rates pool all rounds' samples",
    )
    parser.add_argument("--warmup_steps", type=int, default=3)
    parser.add_argument(
        "--loop_timing", action="store_true",
        help="each round also times the step as the training loop runs it (its stop flags, its "
        "metrics fetched to host loop.METRICS_LAG steps late): loop_images_per_s, over the mean",
    )
    parser.add_argument("--timeout_s", type=float, default=540, help="a layout's limit")
    parser.add_argument(
        "--budget_s",
        type=float,
        default=math.inf,
        help="the run's limit: a layout still running then is stopped, its printed rows kept",
    )
    parser.add_argument("--nccl", type=json.loads, default={"NCCL_SOCKET_NTHREADS": "4",
                                                            "NCCL_NSOCKS_PERTHREAD": "4"})
    parser.add_argument("--tiny", action="store_true", help="a tiny ResNet on 32 px images (CPU)")
    parser.add_argument(
        "--convolution_graphs", default="auto", choices=step_graphs.MODES,
        help="`launch.convolution_graphs`: each step compiled as the trainer compiles it (on GPUs "
        "its convolutions in command buffers, primed by one step without), or `never`",
    )
    parser.add_argument(
        "--hlo_dir", default="",
        help="where process 0 writes each compiled step's optimized HLO (LAYOUT_VARIANT_BATCH.hlo)",
    )
    parser.add_argument(
        "--tell_xla_network", default="",
        help="a `comm.network` name: the processes of a layout of several hosts start with XLA's "
        "latency estimator told their GPUs and that network (jia_jax/xla_network.py)",
    )
    parser.add_argument(
        "--told_bandwidth", type=float, default=1.0,
        help="with --tell_xla_network: the fraction of that network's bandwidth XLA is told, e.g. "
        "what it moves beside backward's kernels rather than alone",
    )
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--layout", default="1x1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--process_id", type=int, default=0)
    parser.add_argument("--out", default="bench_overlap.json")
    return parser


def _add_efficiencies(results: list[dict[str, Any]]) -> None:
    """Each timed row's efficiencies against the 1x1 row of its per-device batch."""
    base = {r["per_device_batch"]: r for r in results
            if r.get("layout") == "1x1" and "images_per_s" in r}
    for r in results:
        one = base.get(r.get("per_device_batch"))
        if "images_per_s" in r and one:
            gpus = r["hosts"] * r["gpus_per_host"]
            r["efficiency"] = r["images_per_s"] / (gpus * one["images_per_s"])
            r["synced_efficiency"] = r["synced_images_per_s"] / (gpus * one["synced_images_per_s"])
            # Over the mean step: the link's stalls counted, as the trainer's logged rate counts
            # them (docs/benchmarks.md, "Does the trainer's loop cost more than its step").
            r["mean_efficiency"] = r["mean_images_per_s"] / (gpus * one["mean_images_per_s"])


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = _parser()
    args = parser.parse_args(argv)
    unknown = set(args.variants).union(*args.layout_variants.values()) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown --variants {sorted(unknown)}; known: {sorted(VARIANTS)}")
    if args.worker:
        worker(args)
        return {}
    deadline = time.monotonic() + args.budget_s
    doc: dict[str, Any] = {"args": vars(args), "results": []}
    for layout in args.layouts:
        doc["results"] += _layout_rows(args, layout, deadline)
        harness.write_json(args.out, doc)
    _add_efficiencies(doc["results"])
    harness.close_record(args.out, doc)
    for r in doc["results"]:
        print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()
               if k in ("layout", "variant", "per_device_batch", "images_per_s",
                        "mean_images_per_s", "loop_images_per_s", "efficiency", "mean_efficiency",
                        "synced_efficiency", "exposed_comm_ms", "idle_ms", "compile_s", "error")})
    return doc


if __name__ == "__main__":
    main()
