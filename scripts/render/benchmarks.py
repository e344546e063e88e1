"""The tables of the JSON that the benchmarks of `scripts/bench/` write: step, allreduce, input,
train_input, gpu_decode (its report), peers, profile_step (and its `.kernels.json.gz`: the step's
device time by what the kernels do), multiprocess, hosts, link and the recoverable-mode loop (and a
killed run's log)."""

from __future__ import annotations

import gzip
import json
import os
import re
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from jia_jax import stage_clock
from scripts.bench import profile_trace


def _environment(doc: dict[str, Any]) -> str:
    env = doc["environment"]
    text = (
        f"{env['device_count']} x {env['device_kind']}, jax {env['jax_version']}, "
        f"XLA_FLAGS='{env['xla_flags']}'"
    )
    if "cuda_device_max_connections" in env:  # recorded since it mattered (GPU decoding)
        text += f", CUDA_DEVICE_MAX_CONNECTIONS={env['cuda_device_max_connections'] or 'unset'}"
    return text


def _flags(flags: str | list[str]) -> str:
    return flags if isinstance(flags, str) else " ".join(flags)


def step_table(doc: dict[str, Any]) -> str:
    """One row per train-step case, plus the XLA-flag variants."""
    synced = any("synced_step_time_s" in r for r in doc["results"])
    lines = [
        f"Train step ({_environment(doc)}; per-device batch as listed, bf16, synthetic data):",
        "",
        (
            "| model | mesh | strategy | bucket MiB | per-device batch | step ms | images/s | "
            "images/s per GPU | efficiency vs 1x1 | compiled collectives |"
        ),
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    if synced:
        # Queued (one step in flight ahead) and synced (each step waited for).
        lines[2:] = [
            (
                "| model | mesh | strategy | wire | bucket MiB | per-device batch | step ms queued | "
                "step ms synced | images/s queued | efficiency queued | efficiency synced | "
                "compiled collectives |"
            ),
            "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
        ]
    rows = [(r, "") for r in doc["results"]]
    rows += [
        (r, f" (`{_flags(r['xla_flags'])}`: {r['speedup_vs_default']:.3f}x)")
        for r in doc.get("variants", [])
        if "step_time_s" in r
    ]
    for r, note in rows:
        if "step_time_s" not in r:
            lines.append(
                f"| {r['model']} | {r.get('mesh_shape', r['mesh'])} | {r['strategy']} | "
                f"{r.get('bucket_mib') or ''} | | skipped: {r.get('skipped') or r.get('error')} "
                "| | | | |"
            )
            continue
        collectives = ", ".join(f"{k} x{v}" for k, v in sorted(r["collectives"].items()))
        if synced:
            lines.append(
                f"| {r['model']} | {r['mesh_shape']} | {r['strategy']}{note} | {r['comm_dtype']} | "
                f"{r['bucket_mib'] or ''} | {r['per_device_batch']} | "
                f"{1e3 * r['step_time_s']:.1f} | {1e3 * r['synced_step_time_s']:.1f} | "
                f"{r['images_per_s']:.0f} | {r['efficiency']:.3f} | "
                f"{r['efficiency_synced']:.3f} | {collectives} |"
            )
            continue
        lines.append(
            f"| {r['model']} | {r['mesh_shape']} | {r['strategy']}{note} | {r['bucket_mib'] or ''} | "
            f"{r['per_device_batch']} | {1e3 * r['step_time_s']:.1f} | {r['images_per_s']:.0f} | "
            f"{r['images_per_s_per_device']:.0f} | {r['efficiency']:.3f} | {collectives} |"
        )
    return "\n".join(lines)


def allreduce_table(doc: dict[str, Any]) -> str:
    """Bus bandwidth per case and its ratio to one plain psum of the same bytes, same run."""
    lines = [
        (
            f"All-reduce ({_environment(doc)}): bus bandwidth 2(n-1)/n * bytes / time; ratio = ours / "
            "one plain `psum` of a flat buffer of the same bytes in the same run:"
        ),
        "",
        "| payload | wire dtype | mesh | strategy | bucket MiB | time ms | bus GB/s | ratio |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: |",
    ]
    in_program = any("call_time_s" in r for r in doc["results"])
    if in_program:
        lines[0] += (
            " time = device time of one reduction inside one program (the difference of 1 + k "
            "and 1 iterations over k); per-call ms = one call of a jitted function of the "
            "payload, host dispatch of every argument and result buffer included; failed cases "
            "listed with their error"
        )
        lines[2:] = [
            (
                "| payload | wire dtype | mesh | strategy | bucket MiB | time ms | bus GB/s | ratio | "
                "per-call ms |"
            ),
            "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: |",
        ]
    for r in doc["results"]:
        if in_program and "error" in r:
            lines.append(
                f"| {r['payload']} | {r['dtype']} | {r['mesh']} | {r['strategy']} | | "
                f"failed: {r['error'].splitlines()[0][:90]} | | | |"
            )
            continue
        if "time_s" not in r:
            continue
        bucket = "" if r["bucket_bytes"] is None else f"{r['bucket_bytes'] / 2**20:g}"
        payload = (
            f"{r['payload']} ({r['payload_bytes'] / 2**20:.0f} MiB, {r['leaves']} leaves)"
            if r["leaves"] > 1
            else f"flat {r['payload_bytes'] / 2**20:g} MiB"
        )
        row = (
            f"| {payload} | {r['dtype']} | {r['mesh']} | {r['strategy']} | {bucket} | "
            f"{1e3 * r['time_s']:.3f} | {r['busbw_gbps']:.1f} | {r['ratio']:.2f} |"
        )
        lines.append(row + (f" {1e3 * r['call_time_s']:.3f} |" if in_program else ""))
    return "\n".join(lines)


def input_table(doc: dict[str, Any]) -> str:
    """Train input images/s per loader, output and core count (scripts/bench/input.py)."""
    first = doc["results"][0]
    lines = [
        (
            f"Train input ({doc['cpu_count']}-core host; {doc['dataset']['images']} JPEGs of "
            f"{doc['dataset']['mean_kb']:.0f} KB mean, batch {first['batch']}, "
            f"{first['image_size']} px):"
        ),
        "",
        (
            "| loader | output | cores | threads | workers | images/s | images/s per core | "
            "images per CPU-second |"
        ),
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in doc["results"]:
        lines.append(
            f"| {r['loader']} | {r['output']} | {r['cores']} | {r['threads']} | {r['workers']} | "
            f"{r['images_per_s']:.0f} | {r['images_per_s_per_core']:.0f} | "
            f"{r['images_per_cpu_s']:.0f} |"
        )
    return "\n".join(lines)


def profile_table(doc: dict[str, Any]) -> str:
    """Where one step's device time goes, per case and GPU (scripts/bench/profile_step.py)."""
    lines = [
        (
            f"Step profile ({_environment(doc)}; ms per step over the "
            f"{doc['results'][0].get('traced_steps', doc['args']['trace_steps'])} traced queued "
            "steps; busy times sum kernel durations; exposed = collective time with no compute "
            "kernel running; overlapped = the rest of it):"
        ),
        "",
        (
            "| case | GPU | step ms queued | step ms synced | span | idle | conv/GEMM | fusions | "
            "concat/slice | collectives | exposed | overlapped | kernels | collectives' compute "
            "ops between start and done |"
        ),
        (
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | "
            "---: | --- |"
        ),
    ]
    for r in doc["results"]:
        wire = f":{r['wire']}" if r.get("wire") else ""
        case = f"{r['model']}:{r['mesh']}:{r['strategy']}:{r['per_device_batch']}{wire}"
        case += f" ({r['variant']})" if r.get("variant") else ""
        overlap = ", ".join(str(c["compute_overlapped"]) for c in r["schedule"])
        for dev, d in sorted(r["devices"].items()):
            lines.append(
                f"| {case} | {dev.split(':')[-1]} | {1e3 * r['queued_step_s']:.2f} | "
                f"{1e3 * r['synced_step_s']:.2f} | {d['span_us'] / 1e3:.2f} | "
                f"{d['idle_us'] / 1e3:.2f} | {d['busy_conv/gemm_us'] / 1e3:.2f} | "
                f"{d['busy_fusion_us'] / 1e3:.2f} | {d['busy_concat/slice_us'] / 1e3:.2f} | "
                f"{d['collective_us'] / 1e3:.2f} | {d['collective_exposed_us'] / 1e3:.2f} | "
                f"{d['collective_overlapped_us'] / 1e3:.2f} | {d['kernels_per_step']:.0f} | "
                f"{overlap} |"
            )
    return "\n".join(lines)


def multiprocess_table(doc: dict[str, Any]) -> str:
    """One process on 1 x n against the same run split over processes (scripts/bench/multiprocess.py)."""
    lines = [
        f"One process against several ({_environment(doc)}; the trainer's last logged interval):",
        "",
        "| layout | mesh | step | loss | images/s |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for name, label in (("one_process", "1 process"), ("processes", "processes")):
        r = doc[name]
        label = label if name == "one_process" else f"{doc['args']['processes']} processes"
        lines.append(
            f"| {label} | {r['mesh']} | {r['step']} | {r['loss']} | {r['images_per_s']:.0f} |"
        )
    lines += ["", f"Throughput ratio (processes / one process): {doc['throughput_ratio']:.4f}."]
    return "\n".join(lines)


def _table(caption: str, header: str, align: str, rows: list[str]) -> str:
    """A caption line, then a markdown table of `header`, `align` and the `rows`."""
    return "\n".join([caption, "", header, align, *rows])


def processes_pack_table(doc: dict[str, Any]) -> str:
    """The trainer as one process and as processes of one host, by where the gradients are packed
    (`comm.pack_after_backward`), synthetic data."""
    return _table(
        f"The trainer on synthetic data ({_environment(doc)}; ResNet-50 64K config, bf16, 256 "
        "images per GPU; median of the logged intervals after the first):",
        "| processes | gradients packed | images/s | vs one process | launch ms a step |",
        "| ---: | --- | ---: | ---: | ---: |",
        [
            f"| {r['processes']} | {r['pack_after_backward']} | {r['images_per_s']:,.0f} | "
            f"{r['ratio_vs_one_process']:.3f} | {r['launch_ms']:.1f} |"
            for r in doc["results"]
        ],
    )


def train_input_table(doc: dict[str, Any]) -> str:
    """`jia_jax.main` images/s on generated JPEGs against synthetic data (scripts/bench/train_input.py)."""
    env = doc["environment"]
    lines = [
        (
            f"Training on real JPEGs ({doc['gpus']} x {env['device_kind']}, {env['cpu_count']} CPU "
            f"cores, jax {env['jax_version']}; ResNet-50 bf16, {doc['args']['per_gpu']} images per "
            f"GPU, {doc['args']['num_workers']} input worker processes; median of the logged "
            "intervals after the first):"
        ),
        "",
        "| data | images/s | vs synthetic |",
        "| --- | ---: | ---: |",
    ]
    for r in doc["results"]:
        rate = f"{r['images_per_s']:.0f}" if "images_per_s" in r else "failed"
        ratio = f"{r['ratio_vs_synthetic']:.3f}" if "ratio_vs_synthetic" in r else ""
        lines.append(f"| {r['variant']} | {rate} | {ratio} |")
    return "\n".join(lines)


def _one_crop_kernel(named: set[str | None]) -> str:
    """`data.gpu_crop_kernel` for a caption where every row ran the same one and says so."""
    [kernel] = named if len(named) == 1 else [None]
    return f", data.gpu_crop_kernel={kernel}" if kernel else ""


def gpu_decode_table(doc: dict[str, Any]) -> str:
    """The trainer with data.decode=gpu against synthetic data, and the decode stage alone
    (scripts/bench/gpu_decode.py, scripts/bench_gpu_decode.sh), in `_gpu_decode_columns`; one
    crop kernel of them all is named in the caption."""
    named = {r.get("crop_kernel") for r in doc["results"]}
    columns = [(head, cell) for head, shown, cell in _gpu_decode_columns(doc["results"]) if shown]
    lines = [
        (
            f"JPEGs decoded on the GPU ({_environment(doc)}{_one_crop_kernel(named)}; "
            "ResNet-50 64K config, bf16, "
            "generated 500x375 JPEGs; the trainer's median images/s over the logged intervals "
            "after the first; decode stage: tiles decoded, cropped and resized per GPU, records "
            "read beforehand):"
        ),
        "",
        f"| {' | '.join(head for head, _ in columns)} |",
        "|" + " ---: |" * len(columns),
    ]
    for r in doc["results"]:
        lines.append(f"| {' | '.join(cell(r) for _, cell in columns)} |")
    whole = [r for r in doc["decode_stage"]["results"] if "whole_image_decode_images_per_s" in r]
    for r in whole:
        lines.append(
            f"\nnvImageCodec's whole-image decode of the same JPEGs, {r['per_gpu']} per call, "
            f"one GPU{into(r)}: {r['whole_image_decode_images_per_s']:,.0f} images/s."
        )
    return "\n".join(lines)


def _gpu_decode_columns(
    results: list[dict[str, Any]],
) -> list[tuple[str, bool, Callable[[dict[str, Any]], str]]]:
    """(header, shown, cell) of each column of `gpu_decode_table`, in order. A processes column
    where some row ran several (records without the field ran one) and who started them where
    jia_jax.main did for some row (its rows say so only if it started them all), decode depth
    and round columns where some row's differ from the defaults, crop kernel, trainers' XLA
    flags and input workers columns where the rows' differ (records without the field do not
    say), a cores-bound column where some row's processes ran on cores of their own; the share
    of time the GPU path's train loop waited for input where the runs logged it, its input
    thread's waits a batch (read, decode), the launch a step and the commands XLA recorded again
    a step where they logged those; the decode stage's rate where its call timed it."""

    def some(test: Callable[[dict[str, Any]], bool]) -> bool:
        return any(test(r) for r in results)

    def number(key: str, fmt: str) -> Callable[[dict[str, Any]], str]:
        return lambda r: "failed" if r.get(key) is None else f"{r[key]:{fmt}}"

    def synthetic(r: dict[str, Any]) -> str:
        rate = number("synthetic_images_per_s", ",.0f")(r)
        if r.get("synthetic_processes", 1) != r.get("processes", 1):
            rate += f" ({r['synthetic_processes']} process)"
        return rate

    def beside_synthetic(key: str, cell: Callable[[Any], str]) -> Callable[[dict[str, Any]], str]:
        """`key`'s value of the GPU-path run, then of its synthetic run (`synthetic_<key>`)."""
        runs = (key, f"synthetic_{key}")
        return lambda r: " / ".join("-" if r.get(k) is None else cell(r[k]) for k in runs)

    launches = beside_synthetic("launch_ms", lambda ms: f"{ms:.1f}")
    recorded = beside_synthetic(
        "command_buffer_updates", lambda u: f"{u['recorded_per_step']:,.0f}"
    )

    def wait(r: dict[str, Any]) -> str:
        return "-" if r.get("input_wait") is None else f"{r['input_wait']:.0%}"

    def started_by(r: dict[str, Any]) -> str:
        if r.get("processes", 1) == 1:
            return "-"
        if r.get("launcher") != "main":
            return "launch_local.sh"
        return "jia_jax.main" if r.get("started") == r["processes"] else "jia_jax.main: did not"

    return [
        ("GPUs", True, lambda r: str(r["gpus"])),
        ("processes", some(lambda r: r.get("processes", 1) > 1), lambda r: str(r["processes"])),
        ("processes started by", some(lambda r: r.get("launcher") == "main"), started_by),
        ("CPU cores", True, lambda r: str(r["cores"])),
        ("images per GPU", True, lambda r: str(r["per_gpu"])),
        ("decode depth", some(lambda r: r.get("depth", 1) > 1), lambda r: str(r.get("depth", 1))),
        ("crop kernel", len({r.get("crop_kernel") for r in results}) > 1,
         lambda r: r.get("crop_kernel", "-")),
        ("chroma", len({r.get("chroma") for r in results}) > 1, lambda r: r.get("chroma", "-")),
        ("decoder options", len({r.get("decoder_options", "") for r in results}) > 1,
         lambda r: r.get("decoder_options") or "-"),
        ("trainers' XLA flags", len({r.get("xla_flags", "") for r in results}) > 1,
         lambda r: r.get("xla_flags") or "-"),
        ("input workers", len({r.get("workers") for r in results}) > 1,
         lambda r: str(r.get("workers", "-"))),
        ("cores bound", some(lambda r: r.get("bound", False)),
         lambda r: "yes" if r.get("bound") else "no"),
        ("round", some(lambda r: r.get("round", 1) > 1), lambda r: str(r.get("round", 1))),
        ("images/s, decode=gpu", True, number("images_per_s", ",.0f")),
        ("images/s, synthetic", True, synthetic),
        ("ratio", True, number("ratio", ".3f")),
        ("decode stage images/s per GPU", some(lambda r: r.get("decode_images_per_s") is not None),
         number("decode_images_per_s", ",.0f")),
        ("input wait, decode=gpu", some(lambda r: "input_wait" in r), wait),
        ("input thread waits a batch, ms", some(lambda r: "input_stages_ms" in r),
         lambda r: stage_clock.describe(r.get("input_stages_ms", {})) or "-"),
        ("launch ms a step, decode=gpu / synthetic", some(lambda r: "launch_ms" in r), launches),
        ("commands recorded again a step, decode=gpu / synthetic",
         some(lambda r: "command_buffer_updates" in r), recorded),
    ]


def into(row: dict[str, Any]) -> str:
    """", into <sample format>" for a whole-image decode row that names its format, else ""."""
    return f", into {row['sample_format']}" if "sample_format" in row else ""


def _decoder_name(row: dict[str, Any]) -> str:
    """The decoder a `loaded` row timed: its extra options and how many took the batches in turn,
    or its stream's priority (the first records compared priorities)."""
    if "highest_priority" in row:
        return f"stream of {'highest' if row['highest_priority'] else 'default'} priority"
    depth = f", {row['depth']} decoders in turn" if row.get("depth", 1) > 1 else ""
    return (row["decoder_options"] or "the trainer's") + depth


def decode_loaded_table(doc: dict[str, Any]) -> str:
    """The decode stage alone and beside training on one GPU (scripts/bench/gpu_decode.py
    `loaded`), with the ms a decoded batch spent in each phase where the run timed them."""
    phases = sorted({k for r in doc["results"] for k in r.get("ms_per_batch", {})})
    lines = [
        (
            f"The decode stage on one GPU ({_environment(doc)}; generated 500x375 JPEGs, "
            f"{doc['results'][0]['per_gpu']} per batch, waited for: "
            f"{doc.get('waited_for', 'each batch')}), alone and while the trainer's ResNet-50 "
            "step trains on the same GPU in another thread:"
        ),
        "",
        "| decoder | beside training | decode images/s | training images/s |"
        + "".join(f" {p} ms |" for p in phases),
        "| --- | --- | ---: | ---: |" + " ---: |" * len(phases),
    ]
    for r in doc["results"]:
        spent = r.get("ms_per_batch", {})
        lines.append(
            f"| {_decoder_name(r)} | "
            f"{'yes' if r['beside_training'] else 'no'} | {r['decode_images_per_s']:,.0f} | "
            f"{r['train_images_per_s']:,.0f} |"
            + "".join(f" {spent[p]:.1f} |" if p in spent else " |" for p in phases)
        )
    return "\n".join(lines)


_DTYPE_NAMES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def peers_table(doc: dict[str, Any]) -> str:
    """One-GPU step rates of the trainer and its peers, same call (scripts/bench/peers.py); with
    trainer variants (model options, XLA flags), a column for them and their speedup."""
    from scripts.bench.peers import variant  # pylint: disable=import-outside-toplevel

    variants = any(variant(r) for r in doc["results"])
    dtypes = {r.get("compute", "bfloat16") for r in doc["results"]}
    extra = (" variant |", " --- |") if variants else ("", "")
    tail = (" vs trainer |", " ---: |") if variants else ("", "")
    dtype = (" compute |", " --- |") if len(dtypes) > 1 else ("", "")
    caption = "compute dtype as listed"
    if len(dtypes) == 1:
        (only,) = dtypes
        caption = _DTYPE_NAMES.get(only, only)
    lines = [
        (
            f"One-GPU step ({_environment(doc)}; synthetic data, {caption}; queued = one step in "
            "flight ahead):"
        ),
        "",
        (
            f"| model | images per GPU |{dtype[0]} kind |{extra[0]} images/s queued | "
            f"images/s synced | trainer / faster peer |{tail[0]}"
        ),
        f"| --- | ---: |{dtype[1]} --- |{extra[1]} ---: | ---: | ---: |{tail[1]}",
    ]
    for r in doc["results"]:
        ratio = f"{r['ratio_vs_faster_peer']:.3f}" if "ratio_vs_faster_peer" in r else ""
        compute = f" {r.get('compute', 'bfloat16')} |" if dtype[0] else ""
        head = f"| {r['model']} | {r['per_device_batch']} |{compute} {r['kind']} |"
        if variants:
            head += f" {variant(r)} |"
        if "images_per_s" not in r:
            lines.append(f"{head} {r.get('error') or r.get('skipped')} | | |" + " |" * variants)
            continue
        speedup = f" {r['speedup_vs_trainer']:.3f} |" if "speedup_vs_trainer" in r else " |"
        lines.append(
            f"{head} {r['images_per_s']:.0f} | {r['synced_images_per_s']:.0f} | {ratio} |"
            + (speedup if variants else "")
        )
    return "\n".join(lines)


# bn_variance_table's baseline runs, and what the fused layers' rows compute in every run.
ONE_PASS = "flax one-pass"
FUSED = "its own (shifted one-pass)"


def bn_variance_table(doc: dict[str, Any]) -> str:
    """The trainer's one-GPU rate with each form of the BatchNorm statistics: `scripts.bench.peers`
    runs from checkouts that differ only in that form, each against flax's one-pass in its call."""
    from scripts.bench.peers import variant  # pylint: disable=import-outside-toplevel

    lines = [
        f"One-GPU step by BatchNorm statistics ({_environment(doc['runs'][0]['doc'])}; synthetic "
        "data, bf16, 256 images; queued = one step in flight ahead; rates against flax's "
        "one-pass E[x^2] - E[x]^2 in the same call):",
        "",
        "| call | model | layers | statistics | images/s queued | images/s synced | "
        "queued vs one-pass | synced vs one-pass |",
        "| ---: | --- | --- | --- | ---: | ---: | ---: | ---: |",
    ]

    def key(run: dict[str, Any], r: dict[str, Any]) -> tuple:
        return run["call"], r["model"], variant(r)

    one_pass = {
        key(run, r): r for run in doc["runs"] if run["statistics"] == ONE_PASS
        for r in run["doc"]["results"]
    }
    for run in doc["runs"]:
        for r in run["doc"]["results"]:
            base = one_pass[key(run, r)]
            fused = r["model"] == "resnet50" and "no_fused_bn" not in variant(r)
            # The fused layers keep their own statistics in every checkout: a noise reference.
            layers, statistics = ("fused", FUSED) if fused else ("plain", run["statistics"])
            lines.append(
                f"| {run['call']} | {r['model']} | {layers} | {statistics} | "
                f"{r['images_per_s']:.0f} | {r['synced_images_per_s']:.0f} | "
                f"{r['images_per_s'] / base['images_per_s']:.3f} | "
                f"{r['synced_images_per_s'] / base['synced_images_per_s']:.3f} |"
            )
    return "\n".join(lines)


def breakdown_table(path: str) -> str:
    """A profile's device time per step by what the kernels do (profile_trace.fusion_breakdown)."""
    with gzip.open(path, "rt") as f:
        cases = json.load(f)
    with open(path.removesuffix(".kernels.json.gz")) as f:
        rows = json.load(f)["results"]  # in the order of the cases, as profile_step writes both
    lines = [
        "Device time per step by kind of kernel (ms, kernels per step in brackets):",
        "",
        "| case | GPU | " + " | ".join(profile_trace.BREAKDOWN_CATEGORIES) + " | total |",
        "| --- | ---: | "
        + " | ".join("---:" for _ in profile_trace.BREAKDOWN_CATEGORIES)
        + " | ---: |",
    ]
    for (case, devices), row in zip(cases.items(), rows, strict=True):
        for dev, records in sorted(devices.items()):
            kernels = [profile_trace.Kernel(*k) for k in records]
            split = profile_trace.fusion_breakdown(kernels, row["traced_steps"])
            cells = [
                f"{v['us_per_step'] / 1e3:.2f} ({v['count_per_step']:.0f})" for v in split.values()
            ]
            total = sum(v["us_per_step"] for v in split.values()) / 1e3
            lines.append(f"| {case} | {dev[-1]} | " + " | ".join(cells) + f" | {total:.2f} |")
    return "\n".join(lines)


def bandwidth_table(path: str, top: int = 8) -> str:
    """The fusion kernels of a profile furthest below a reference bandwidth, per case whose
    optimized HLO lies beside the record (`<record>.<model>_<mesh>_<strategy>_<batch>.hlo.gz`)."""
    from scripts.bench import kernel_bandwidth  # pylint: disable=import-outside-toplevel

    with open(path) as f:
        doc = json.load(f)
    gb_s = 3000.0
    lines = [
        f"Fusion kernels by time beyond their bytes at {gb_s / 1e3:.1f} TB/s ({_environment(doc)}; "
        "bytes = the fusion's operands read once and its results written once, per step):",
        "",
        "| case | kernel | module | launches | µs per step | MB per step | GB/s | µs beyond |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in doc["results"]:
        case = f"{r['model']}:{r['mesh']}:{r['strategy']}:{r['per_device_batch']}"
        hlo = f"{path.removesuffix('.json')}.{case.replace(':', '_')}.hlo.gz"
        if not os.path.exists(hlo):
            continue
        for k in kernel_bandwidth.case_rows(path, case, hlo, gb_s)[:top]:
            # The op's module path: without the jit/autodiff wrappers, flax's method and the
            # primitive; "backward" where autodiff transposed it.
            wrappers = ("jit(step)", "jvp(", "transpose(")
            parts = [p for p in k["op"].split("/")[:-1] if not p.startswith(wrappers)]
            op = "/".join(p for p in parts if not p.endswith("._plain")) or "(none)"
            op += " (backward)" if "transpose(" in k["op"] else ""
            lines.append(
                f"| {case} | {k['kernel']} | {op} | {k['launches_per_step']:.0f} | "
                f"{k['us_per_step']:.0f} | {k['mb_per_step']:.0f} | {k['gb_per_s']:.0f} | "
                f"{k['excess_us']:.0f} |"
            )
    return "\n".join(lines)


def _pivot_table(
    doc: dict[str, Any], title: str, keys: Sequence[tuple[str, str]], column: str, value: str
) -> str:
    """A row per shape (`keys`: each shape column's header and field), a column per value of the
    results' `column` field, cells their `value` to the unit (blank where a run failed)."""
    columns = list(dict.fromkeys(r[column] for r in doc["results"]))
    lines = [
        title,
        "",
        "| " + " | ".join([*(header for header, _ in keys), *columns]) + " |",
        "| " + " | ".join("---:" for _ in [*keys, *columns]) + " |",
    ]
    shapes: dict[tuple, dict[str, Any]] = {}
    for r in doc["results"]:
        shapes.setdefault(tuple(r[field] for _, field in keys), {})[r[column]] = r
    for shape, by_column in shapes.items():
        cells = [f"{by_column[c][value]:.0f}" if value in by_column.get(c, {}) else ""
                 for c in columns]
        lines.append("| " + " | ".join([*map(str, shape), *cells]) + " |")
    return "\n".join(lines)


def bn_reductions_table(doc: dict[str, Any]) -> str:
    """GB/s of ResNet-50's BatchNorm sums per shape and variant (scripts/bench/bn_reductions.py)."""
    title = f"BatchNorm sums, GB/s of the bytes read ({_environment(doc)}; copy reads and writes):"
    keys = (("images", "batch"), ("size", "size"), ("channels", "channels"))
    return _pivot_table(doc, title, keys, "op", "gb_per_s")


def conv_stats_table(doc: dict[str, Any]) -> str:
    """µs of ResNet-50's 1x1 convolutions with and without their BatchNorm statistics, per
    variant (scripts/bench/conv_stats.py)."""
    title = (
        f"1x1 convolutions (matrix products) and their output's BatchNorm statistics, µs a call "
        f"({_environment(doc)}; bf16, fp32 accumulation):"
    )
    keys = (("images", "batch"), ("size", "size"), ("in", "in_channels"), ("out", "out_channels"))
    return _pivot_table(doc, title, keys, "variant", "us")


def cudnn_genstats_table(doc: dict[str, Any]) -> str:
    """µs of ResNet-50's convolutions after the stem, XLA's and cuDNN graphs' with BatchNorm's
    sums in the kernel (scripts/bench/cudnn_genstats.py), and a forward pass's total of each."""
    title = (
        f"Convolutions and their output's BatchNorm sums, µs a call ({_environment(doc)}; bf16, "
        "fp32 accumulation; convs: how many of the shape one forward pass has):"
    )
    keys = (("images", "batch"), ("size", "size"), ("in", "in_channels"),
            ("out", "out_channels"), ("kernel", "kernel"), ("stride", "stride"),
            ("convs", "count"))
    lines = [_pivot_table(doc, title, keys, "variant", "us")]
    columns = list(dict.fromkeys(r["variant"] for r in doc["results"]))
    for batch in sorted({r["batch"] for r in doc["per_step"]}, reverse=True):
        totals = {r["variant"]: r["us"] for r in doc["per_step"] if r["batch"] == batch}
        cells = [f"{totals[c]:,.0f}" if c in totals else "" for c in columns]
        shapes = {tuple(r[f] for _, f in keys): r["count"] for r in doc["results"]
                  if r["batch"] == batch}
        lines.append(f"| {batch} | all | | | | | {sum(shapes.values())} | " + " | ".join(cells)
                     + " |")
    return "\n".join(lines)


def pack_fusion_table(doc: dict[str, Any]) -> str:
    """Rate and fusion kinds of the ResNet-50 step per way of packing its gradients
    (scripts/bench/pack_fusion.py); `vs xla` is the queued rate over the same batch's `xla` row."""
    lines = [
        f"ResNet-50 step, bf16 ({_environment(doc)}; images/s of all GPUs; fusions: how many the "
        "step's optimized HLO runs, and of them `loop_select` / `input_reduce_select`, blank "
        "where a kind was not among those the run recorded):",
        "",
        "| GPUs | images/GPU | variant | images/s queued | images/s synced | vs xla | fusions "
        "| loop_select | input_reduce_select |",
        "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    xla = {r["per_device_batch"]: r["images_per_s"] for r in doc["results"]
           if r["variant"] == "xla" and "images_per_s" in r}
    for r in doc["results"]:
        head = f"| {r['gpus']} | {r['per_device_batch']} | {r['variant']} |"
        if "images_per_s" not in r:
            lines.append(f"{head} not measured: {r.get('error', '')[:120]} | | | | | |")
            continue
        base = xla.get(r["per_device_batch"])
        ratio = f"{r['images_per_s'] / base:.3f}" if base else ""
        kinds = r["kinds"]
        lines.append(
            f"{head} {r['images_per_s']:.0f} | {r['synced_images_per_s']:.0f} | {ratio} | "
            f"{r['fusions']} | {kinds.get('loop_select', '')} | "
            f"{kinds.get('input_reduce_select', '')} |"
        )
    return "\n".join(lines)


def _where(doc: dict[str, Any]) -> str:
    """The machine of a run: its environment block, else its provenance's device without the
    label of the pool it was lent from (`nvidia-h100-x4: 4x H100 ...` -> `4x H100 ...`)."""
    if "environment" in doc:
        return _environment(doc)
    return re.sub(r"^[\w.-]+: ", "", doc["provenance"]["device"])


def link_table(doc: dict[str, Any]) -> str:
    """Bus bandwidth of one all-reduce per mesh level and NCCL setting (scripts/bench/link.py);
    runs of several sizes get a size column (older runs timed one size, `args.size_mib`)."""
    args = doc["args"]
    sizes = args["size_mib"] if isinstance(args["size_mib"], list) else [args["size_mib"]]
    several = len(sizes) > 1
    size = "" if several else f" of {sizes[0]} MiB per GPU"
    lines = [
        f"One fp32 all-reduce{size}, {args['hosts']} processes x "
        f"{args['gpus_per_host']} GPUs ({_where(doc)}), bus bandwidth in GB/s:",
        "",
        "| NCCL setting |" + " MiB per GPU |" * several + " hosts to NCCL | `gpu` axis (in a "
        "process) | `node` axis (across) | both axes |",
        "| --- |" + " ---: |" * several + " ---: | ---: | ---: | ---: |",
    ]
    for r in doc["results"]:
        head = f"| {r['variant']} |" + (f" {r.get('size_bytes', 0) / (1 << 20):.3g} |" * several)
        if "error" in r:
            lines.append(f"{head} failed | | | |")
            continue
        hosts = args["hosts"] if r["settings"]["separate_hosts"] else 1
        cells = " | ".join(f"{r[a]['bus_gb_s']:.2f}" for a in ("gpu", "node", "both"))
        lines.append(f"{head} {hosts} | {cells} |")
    return "\n".join(lines)


def _hosts_strategy(row: dict[str, Any]) -> str:
    """A hosts row's strategy with its `--row_variant`: overrides, environment variables and
    the checkout it ran; the run of a file that holds several."""
    parts = [row["strategy"]] + [o.removeprefix("--config.") for o in row.get("overrides", [])]
    parts += [f"{name}={value}" for name, value in row.get("env", {}).items()]
    if "source" in row:
        parts.append(f"(trainer of {os.path.basename(row['source'].rstrip('/'))})")
    if row.get("timing") == "in-process":
        parts.append("(timed in-process, against its own one-GPU step)")
    told = {"": ", XLA untold"}.get(row["told"], ", XLA told") if "told" in row else ""
    run = f" (run {row['run']})" if "run" in row else ""  # a file merged from several calls
    return " ".join(parts) + told + run


def hosts_table(doc: dict[str, Any]) -> str:
    """The trainer across emulated hosts against one GPU, same run (scripts/bench/hosts.py)."""
    lines = [
        f"The trainer's logged images/s ({_where(doc)}; ResNet-50 64K config, bf16, synthetic "
        "data; median of the logged intervals after the first):",
        "",
        "| hosts x GPUs | strategy | XLA flags | per GPU | images/s | efficiency | "
        "exposed comm ms/step | idle ms/step |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in doc["results"]:
        flags = r.get("xla_flags") or ""
        flags = "SOL latency estimator, 2 GPUs/node" if "sol_latency" in flags else flags or "-"
        strategy = _hosts_strategy(r)
        if "error" in r:
            lines.append(
                f"| {r['hosts']}x{r['gpus_per_host']} | {strategy} | {flags} | "
                f"{r['per_device_batch']} | failed | | | |"
            )
            continue
        exposed = f"{r['exposed_comm_ms']:.1f}" if "exposed_comm_ms" in r else "-"
        idle = f"{r['idle_ms']:.1f}" if "idle_ms" in r else "-"
        lines.append(
            f"| {r['hosts']}x{r['gpus_per_host']} | {strategy} | {flags} | "
            f"{r['per_device_batch']} | {r['images_per_s']:.0f} | {r['efficiency']:.3f} | "
            f"{exposed} | {idle} |"
        )
    return "\n".join(lines)


def overlap_table(doc: dict[str, Any]) -> str:
    """Each (layout, variant, batch) row of scripts/bench/overlap.py: rates, efficiency, trace;
    over the mean step too where the file has it (`mean_efficiency`)."""
    rows = [r for r in doc["results"] if "images_per_s" in r]
    means = all("mean_efficiency" in r for r in rows)
    lines = [
        f"The trainer's step timed in-process ({_where(doc)}; ResNet-50 64K config, bf16, `flat`, "
        "synthetic data; efficiency against the 1x1 row of the same batch"
        + ("; images/s over the median queued step, mean images/s over the mean" if means else "")
        + "):",
        "",
        "| processes x GPUs | variant | per GPU | images/s | efficiency "
        + ("| mean images/s | mean efficiency " if means else "")
        + "| synced images/s | synced efficiency | exposed comm ms/step | idle ms/step |",
        "| --- | --- | ---: | ---: | ---: |" + (" ---: | ---: |" if means else "")
        + " ---: | ---: | ---: | ---: |",
    ]
    # Computed here, not read: a run cut short by its time limit wrote its rows but not these.
    # Against the 1x1 row of the same run where a file holds several runs of a call, else the
    # file's first of that batch.
    one = {}
    for r in rows:
        if r["layout"] == "1x1":
            one.setdefault((r.get("run"), r["per_device_batch"]), r)
            one.setdefault(r["per_device_batch"], r)
    for r in rows:
        batch, gpus = r["per_device_batch"], r["hosts"] * r["gpus_per_host"]
        base = one.get((r.get("run"), batch), one.get(batch))
        efficiency, synced = "-", "-"
        if base:
            efficiency = f"{r['images_per_s'] / (gpus * base['images_per_s']):.3f}"
            synced = f"{r['synced_images_per_s'] / (gpus * base['synced_images_per_s']):.3f}"
        mean = (f"{r['mean_images_per_s']:.0f} | {r['mean_efficiency']:.3f} | "
                if means else "")
        lines.append(
            f"| {r['layout']} | {_overlap_variant(r) if r['layout'] != '1x1' else '-'} | "
            f"{r['per_device_batch']} | {r['images_per_s']:.0f} | {efficiency} | {mean}"
            f"{r['synced_images_per_s']:.0f} | {synced} | "
            f"{r['exposed_comm_ms']:.1f} | {r['idle_ms']:.1f} |"
        )
    return "\n".join(lines)


def _overlap_variant(row: dict[str, Any]) -> str:
    """An overlap row's variant, with the network XLA's estimator was told, NCCL settings of its
    own, the host's setting it ran under, and the run of its call where the file holds several
    (`told`, `nccl`, `setting`, `run`)."""
    told = f", told {row['told']}" if row.get("told") else ""
    nccl = "".join(f", {name}={value}" for name, value in row.get("nccl", {}).items())
    setting = f", {row['setting']}" if row.get("setting") else ""
    run = f" (run {row['run']})" if "run" in row else ""
    return f"{row['variant']}{told}{nccl}{setting}{run}"


def _bucket_collective(c: dict[str, Any], row: dict[str, Any], named: bool) -> str | None:
    """A schedule entry's gradient collective as the table names it; None for the others (the
    statistics' fp32 all-reduce)."""
    if "u8[" in c["shape"]:  # the fp8 wire's: its operands (the tuple's first part), one a bucket
        operands = re.findall(r"u8\[[\d,]+\]", c["shape"].split(")")[0])
        return f"{c['op']} {' + '.join(operands)}"
    if "bf16" not in c["shape"]:
        return None
    sizes = [int(n) for n in re.findall(r"bf16\[(\d+)\]", c["shape"])]
    # A synchronous reduce-scatter shows only its output, 1/n of the bucket.
    alone = c["op"] == "reduce-scatter" and len(sizes) == 1
    size = sizes[0] * row["hosts"] * row["gpus_per_host"] if alone else max(sizes)
    return f"{c['op']} bf16[{size}]" if named else f"bf16[{size}]"


def overlap_schedule_table(doc: dict[str, Any]) -> str:
    """Where XLA put each gradient bucket's all-reduce in the step (2 hosts x 1 GPU rows)."""
    rows = [r for r in doc["results"] if r.get("layout") == "2x1" and "schedule" in r]
    # Files since the bench recorded it: the convolutions up to the last one a bucket needs.
    ready = any("convolutions_until_ready" in c for r in rows for c in r["schedule"])
    # The sharded step's buckets leave as reduce-scatters and return as all-gathers; the fp8
    # wire's as all-to-alls and all-gathers of u8 chunks.
    named = any(c["op"] != "all-reduce" for r in rows for c in r["schedule"])
    fp8 = any("u8[" in c["shape"] for r in rows for c in r["schedule"])
    lines = [
        "Each gradient "
        + ("bucket's collective" if named else "all-reduce")
        + " of the 2 processes x 1 GPU steps in XLA's schedule: the "
        "convolutions (of all of forward and backward) scheduled "
        + ("up to the last one its bucket needs, " if ready else "")
        + "before its start and between its start and its done"
        + (" (each bucket by its whole size" if named else "")
        + ("; fp8 chunks by their operands" if fp8 else "")
        + (")" if named else "")
        + ":",
        "",
        f"| variant | per GPU | {'collective' if named else 'all-reduce'} |"
        + (" convolutions until ready |" if ready else "")
        + " convolutions before start | convolutions between | of |",
        "| --- | ---: | --- |" + (" ---: |" if ready else "") + " ---: | ---: | ---: |",
    ]
    for r in rows:
        for c in r["schedule"]:
            what = _bucket_collective(c, r, named)
            if what is None:
                continue
            until = f" {c['convolutions_until_ready']} |" if ready else ""
            lines.append(
                f"| {_overlap_variant(r)} | {r['per_device_batch']} | {what} |{until} "
                f"{c['convolutions_before_start']} | {c['convolutions_between']} | "
                f"{c['convolutions']} |"
            )
    return "\n".join(lines)


def overlap_collectives_table(doc: dict[str, Any]) -> str:
    """How long each process spent in each collective kernel of its traced queued steps (rows
    with `queued_collectives_ms`): equal where the wire set the time, longer in the process that
    reached the collective first and waited for the others. Each step runs the collectives of
    the row's `schedule` in its order."""
    rows = [r for r in doc["results"]
            if "schedule" in r and any(g[0] for g in r.get("queued_collectives_ms", []))]
    processes = max(len(r["queued_collectives_ms"]) for r in rows)
    lines = [
        "Each collective kernel of the traced queued steps, ms in it per process (its first GPU), "
        "named as XLA's schedule orders them:",
        "",
        "| variant | per GPU | traced step | collective |"
        + "".join(f" process {p} |" for p in range(processes)),
        "| --- | ---: | ---: | --- |" + " ---: |" * processes,
    ]
    for r in rows:
        spans = [gpus[0] for gpus in r["queued_collectives_ms"]]
        names = [_collective_name(c) for c in r["schedule"]]
        for i in range(min(len(s) for s in spans)):
            took = "".join(f" {s[i][1] - s[i][0]:.2f} |" for s in spans)
            lines.append(f"| {_overlap_variant(r)} | {r['per_device_batch']} | "
                         f"{i // len(names) + 1} | {names[i % len(names)]} |{took}")
    return "\n".join(lines)


def _collective_name(c: dict[str, Any]) -> str:
    """A schedule entry as its op and result shape (the tuple's last part)."""
    shape = c["shape"].rsplit(", ", 1)[-1].rstrip(")")
    return f"{c['op']} {re.sub(r'[{][0-9,]*[}]', '', shape)}"


def hosts_boundaries_table(doc: dict[str, Any]) -> str:
    """How the kernels of each traced GPU's compute stream followed one another, per row of
    scripts/bench/hosts.py that was traced (`--profile_steps`)."""
    lines = [
        f"Each traced GPU's busiest stream ({_where(doc)}; ResNet-50 64K config, bf16, synthetic "
        "data; boundaries between consecutive kernels under 10 µs, per traced step; a process's "
        "GPUs in order, the processes in order):",
        "",
        "| hosts x GPUs | strategy | per GPU | GPU | boundaries a step | negative a step | "
        "median boundary µs | boundaries µs a step |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in doc["results"]:
        for i, b in enumerate(r.get("boundaries") or []):
            median = f"{b['p50_us']:.2f}" if b["p50_us"] is not None else "-"
            lines.append(
                f"| {r['hosts']}x{r['gpus_per_host']} | {_hosts_strategy(r)} | "
                f"{r['per_device_batch']} | {i} | {b['count_per_step']:,.0f} | "
                f"{b['negative_per_step']:,.0f} | {median} | {b['sum_us_per_step']:,.0f} |"
            )
    return "\n".join(lines)


def hosts_accounting_table(doc: dict[str, Any]) -> str:
    """Where each traced row of scripts/bench/hosts.py spends its step: the timed step (from
    its logged rate), then its traced steps' span split into the time some compute kernel runs,
    communication no compute kernel overlaps, and idle time, averaged over its GPUs; where the
    file has them, the span and exposed communication over the traced steps after the first
    (`steady`: without the processes' start apart)."""
    traced = [r for r in doc["results"] if "span_ms" in r]
    steady = any(r.get("steady") for r in traced)
    later = " | steps after the first: step ms | exposed comm ms" if steady else ""
    lines = [
        f"The step's time ({_where(doc)}; ResNet-50 64K config, bf16, synthetic data; timed: "
        "from the logged images/s per GPU; the rest per traced step, averaged over the GPUs):",
        "",
        "| hosts x GPUs | strategy | per GPU | timed step ms | traced step ms | compute ms | "
        f"exposed comm ms | idle ms{later} |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |" + " ---: | ---: |" * steady,
    ]
    for r in traced:
        per_gpu = r["images_per_s"] / (r["hosts"] * r["gpus_per_host"])
        s = r.get("steady")
        after = (f" {s['span_ms']:.2f} | {s['exposed_comm_ms']:.2f} |" if s else " - | - |")
        lines.append(
            f"| {r['hosts']}x{r['gpus_per_host']} | {_hosts_strategy(r)} | "
            f"{r['per_device_batch']} | {1e3 * r['per_device_batch'] / per_gpu:.2f} | "
            f"{r['span_ms']:.2f} | {r['compute_ms']:.2f} | {r['exposed_comm_ms']:.2f} | "
            f"{r['idle_ms']:.2f} |" + after * steady
        )
    return "\n".join(lines)


# `<raw file>#<view>`: a second table of a raw file (scripts/render's `render`).
VIEWS = {"schedule": overlap_schedule_table, "collectives": overlap_collectives_table,
         "boundaries": hosts_boundaries_table, "accounting": hosts_accounting_table}


def repro_table(doc: dict[str, Any]) -> str:
    """Each combination of JAX's recoverable mode and a `get_live_nodes` polling thread under a
    data-parallel loop across emulated hosts."""
    args = doc["args"]
    length = (
        f"{args['steps']} steps"
        if "steps" in args
        else f"{args['seconds']} s by each process's own clock"
    )
    return _table(
        f"2 emulated hosts x {args['gpus_per_host']} GPUs, {length} of a data-parallel loop "
        f"({_where(doc)}):",
        "| recoverable mode | get_live_nodes thread | exit statuses | steps | heap crash |",
        "| --- | --- | --- | --- | --- |",
        [
            f"| {r['recoverable']} | {r['poll_get_live_nodes']} | {r['returncodes']} | "
            f"{r['steps']} | {r['crashed']} |"
            for r in doc["results"]
        ],
    )


def killed_table(path: str, doc: dict[str, Any]) -> str:
    """What a survivor printed when a peer was killed: the lines of the run's log that say so."""
    with open(path.removesuffix(".json") + ".log") as f:
        said = [line.rstrip() for line in f if " stopped " in line or "killed process" in line]
    return "\n".join(["```", *said, "```"])


def _crop_schedule(row: dict[str, Any]) -> str:
    """A crop_in_step row's annotated calls as the schedule placed them: instructions between
    each start and its done, and the call's execution thread."""
    return ", ".join(f"{c['instructions_between']} ({c['execution_thread']})"
                     for c in row.get("stream_calls", [])) or "-"


def crop_in_step_table(doc: dict[str, Any]) -> str:
    """The train step with the GPU path's crop apart or in its program (scripts/bench/
    crop_in_step.py): rates, ms a step beyond the step alone, and each round's median step;
    where traced, the µs a step two kernels ran at once, and where its HLO was read, what the
    schedule put between each of the crop's calls' start and done."""
    rounds, rows = doc["args"]["rounds"], doc["results"]
    model = {"resnet50": "ResNet-50", "alexnet_bn": "AlexNet-BN"}[doc["args"]["train_model"]]
    traced = any("trace" in r for r in rows)
    read = any("stream_calls" in r for r in rows)
    extra = ((" µs a step two kernels ran at once |" if traced else "")
             + (" instructions between the crop's calls' start and done (thread) |"
                if read else ""))
    lines = [
        f"The trainer's step on one GPU ({_where(doc)}; {model} 64K config, bf16; one step in "
        f"flight ahead; the crop's products `{rows[0]['crop_kernel']}`; {rounds} "
        "rounds, each variant in turn"
        + ("; 10 empty kernels on a second stream first" if doc["args"].get("later_mode")
           else "") + "):",
        "",
        "| per GPU | variant | images/s | mean images/s | synced images/s | ms a step beyond "
        "`alone` | median ms a step, each round |" + extra,
        "| ---: | --- | ---: | ---: | ---: | ---: | --- |"
        + " ---: |" * traced + " --- |" * read,
    ]
    for r in rows:
        each = len(r["samples_s"]) // rounds
        medians = [statistics.median(r["samples_s"][i * each:(i + 1) * each]) * 1e3
                   for i in range(rounds)]
        beyond = f"{r['ms_beyond_alone']:.2f}" if "ms_beyond_alone" in r else "-"
        lines.append(
            f"| {r['per_gpu']} | {r['variant']} | {r['images_per_s']:.0f} | "
            f"{r['mean_images_per_s']:.0f} | {r['synced_images_per_s']:.0f} | {beyond} | "
            + ", ".join(f"{m:.2f}" for m in medians) + " |"
            + (f" {r['trace']['concurrent_us']:.0f} |" if traced else "")
            + (f" {_crop_schedule(r)} |" if read else "")
        )
    return "\n".join(lines)


def kernels_so_far(results: list[dict[str, Any]]) -> list[int]:
    """Empty kernels launched on a stream of the process other than the step's before each row
    of a scripts/bench/second_stream.py run (its `k`, `x`, `g`, `c` and `n` actions add up;
    `j`, `r`, `y`, `q`, `m`, `p`, `h` and `destroy` add none)."""
    total, counts = 0, []
    for r in results:
        total += r["count"] if r["action"] in ("k", "x", "g", "c", "n") else 0
        counts.append(total)
    return counts


def second_stream_table(doc: dict[str, Any]) -> str:
    """The step alone after each action of scripts/bench/second_stream.py, per run (a process
    each): how the kernels of its stream followed one another, and its rate where timed. A
    run's `setting` (what else differed), or else its environment variables, in its rows."""
    runs = doc.get("runs") or [{"name": "-", "environment_variables": {},
                                "results": doc["results"]}]
    per_gpu = doc.get("per_gpu") or doc["args"]["per_gpu"]
    lines = [
        f"The trainer's step alone after each action ({_where(doc)}; ResNet-50 64K config, bf16, "
        f"synthetic data, {per_gpu} images, one step in flight ahead; a run is a process; "
        "boundaries of its busiest stream under 10 µs, per traced step):",
        "",
        "| run | setting | action | kernels on the second stream so far | traced steps | "
        "median boundary µs | boundaries µs a step | images/s |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for run in runs:
        env = run.get("setting") or " ".join(
            f"{k}={v}" for k, v in run["environment_variables"].items()) or "-"
        for r, so_far in zip(run["results"], kernels_so_far(run["results"])):
            b = r["boundaries"] or {}
            action = f"{r['action']}{r['count'] or ''}"
            median = f"{b['p50_us']:.2f}" if b else "-"
            total = f"{b['sum_us_per_step']:,.0f}" if b else "-"
            rate = f"{r['train_images_per_s']:,.0f}" if "train_images_per_s" in r else "-"
            lines.append(f"| {run['name']} | {env} | {action} | {so_far:,} | "
                         f"{r['traced_steps']} | {median} | {total} | {rate} |")
    return "\n".join(lines)


def contention_table(doc: dict[str, Any]) -> str:
    """scripts/bench/gpu_decode.py contention: per round and load, how the step's kernels
    followed one another in its traced steps, its rate over the row (the traced steps
    included) and the load's own rate."""
    lines = [
        f"The trainer's step beside each load ({_where(doc)}; ResNet-50 64K config, bf16, "
        "synthetic data, one step in flight ahead; boundaries of its busiest stream under 10 µs, "
        "per traced step; images/s over the row, its traced steps included):",
        "",
        "| per GPU | round | load | decoder options | traced steps | median boundary µs | "
        "boundaries µs a step | images/s | load images/s |",
        "| ---: | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in doc["results"]:
        b = r.get("boundaries") or {}
        median = f"{b['p50_us']:.2f}" if b else "-"
        total = f"{b['sum_us_per_step']:,.0f}" if b else "-"
        load = f"{r['load_images_per_s']:,.0f}" if "load_images_per_s" in r else "-"
        lines.append(
            f"| {r['per_gpu']} | {r['round']} | {r['load']} | {r.get('decoder_options') or '-'} | "
            f"{r.get('traced_steps', '-')} | {median} | {total} | "
            f"{r['train_images_per_s']:,.0f} | {load} |"
        )
    return "\n".join(lines)


def graphs_capture_table(doc: dict[str, Any]) -> str:
    """Runs of the step with convolutions in command buffers, by how they got there and where
    their convolutions' algorithms came from: which trained and which failed."""
    lines = [
        f"ResNet-50 at 64 images on one GPU ({_where(doc)}; runs one after "
        "another, each a process of its own):",
        "",
        "| call | run | program | convolutions in graphs | autotuning cache | result |",
        "| ---: | --- | --- | --- | --- | --- |",
    ]
    for r in doc["rows"]:
        if not r["ok"]:
            result = "failed: " + r["error"].removeprefix("jax.errors.JaxRuntimeError: ")
        elif "queued_ms" in r:
            result = f"{r['queued_ms']:.2f} ms a step queued"
        else:
            result = f"{r['images_per_s']:.0f} images/s, launch {r['launch_ms']:.1f} ms a step"
        env = "".join(f", {k}={v}" for k, v in r.get("env", {}).items())
        program = r["program"] + (f", strategy {r['strategy']}" if "strategy" in r else "")
        lines.append(
            f"| {r['call']} | {r['run']} | {program}{env} | {r['graphs']} | "
            f"{r['autotune_cache']} | {result} |"
        )
    return "\n".join(lines)


def graphs_runs_table(doc: dict[str, Any]) -> str:
    """The trainer with and without its convolutions in command buffers, on synthetic data and
    on the GPU input path, round by round; each run's rate over the same round's synthetic run
    of the same setting."""
    runs = [r for r in doc["runs"] if "images_per_s" in r]
    synthetic = {(r["round"], r["convolution_graphs"]): r["images_per_s"]
                 for r in runs if r["variant"] == "synthetic"}
    lines = [
        f"`python -m jia_jax.main` at {doc['runs'][0]['args']['per_gpu']} images per GPU "
        f"({_where(doc)}; ResNet-50 64K config, bf16; the trainer's median "
        "images/s over the logged intervals after the first):",
        "",
        "| round | data | `launch.convolution_graphs` | images/s | launch ms a step | input wait "
        "| over synthetic |",
        "| ---: | --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for r in doc["runs"]:
        if "images_per_s" not in r:
            lines.append(f"| {r['round']} | {r['variant']} | {r['convolution_graphs']} | "
                         f"{r['error']} | | | |")
            continue
        base = synthetic.get((r["round"], r["convolution_graphs"]))
        ratio = f"{r['images_per_s'] / base:.3f}" if base else "-"
        lines.append(
            f"| {r['round']} | {r['variant']} | {r['convolution_graphs']} | "
            f"{r['images_per_s']:,.0f} | {r['launch_ms']:.1f} | {r['input_wait']:.0%} | {ratio} |"
        )
    return "\n".join(lines)


def over_intervals(intervals: list[list[float]], per_gpu: int) -> float:
    """A run's images/s over its logged intervals after the first: all their images over all
    their time, where the median of their rates passes over one slow interval."""
    steps = [b[0] - a[0] for a, b in zip(intervals, intervals[1:])]
    seconds = sum(n * per_gpu / r[1] for n, r in zip(steps, intervals[1:]))
    return sum(steps) * per_gpu / seconds


def gc_runs_table(doc: dict[str, Any]) -> str:
    """The trainer with what it built frozen out of Python's collector, or not
    (scripts/bench/gc_pauses.py): per run its rates, against the synthetic run of its call (else
    of the next call on the same machine), and its collector's passes over the logged window."""
    runs = doc["runs"]
    rates = [over_intervals(r["intervals"], r["per_gpu"]) for r in runs]
    synthetic = {r["call"]: rate for r, rate in zip(runs, rates) if r["variant"] == "synthetic"}
    lines = [
        f"`python -m jia_jax.main` at {doc['per_gpu']} images per GPU ({_where(doc)}; ResNet-50 "
        "64K config, bf16; images/s over the logged intervals after the first, as their median "
        "and as all their images over all their time; the collector's passes between the "
        "progress lines its window covers):",
        "",
        "| call | data | collector | steps | images/s, median | images/s, all | of synthetic | "
        "window s | full passes | their ms (longest) | other passes ms a second |",
        "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |",
    ]
    for r, rate in zip(runs, rates):
        base = synthetic.get(r["call"]) or synthetic.get(r["call"] + 1)
        of = f"{rate / base:.3f}" if base else "-"
        g = r.get("gc_pauses")
        passes = (f"{g['window_s']:.1f} | {g['gen2']['passes']} | {g['gen2']['total_ms']:,.1f} "
                  f"({g['gen2']['max_ms']:.1f}) | "
                  f"{g['gen0']['ms_per_s'] + g['gen1']['ms_per_s']:.1f}") if g else "- | - | - | -"
        lines.append(
            f"| {r['call']} | {r['variant']} | {r['collector']} | {r['steps']:,} | "
            f"{r['images_per_s']:,.0f} | {rate:,.0f} | {of} | {passes} |"
        )
    return "\n".join(lines)


def planar_runs_table(doc: dict[str, Any]) -> str:
    """The trainer on the GPU path with its decoders writing RGB or planar YCbCr
    (scripts/bench/planar_decode.py), each run against the synthetic run at its batch."""
    runs = doc["runs"]
    synthetic = {r["per_gpu"]: r["images_per_s"] for r in runs if r["data"] == "synthetic"}
    lines = [
        f"`python -m jia_jax.main` on one GPU ({_where(doc)}; ResNet-50 64K config, bf16, "
        "generated 500x375 JPEGs decoded on the GPU into RGB, or into planar YCbCr with no colour "
        "conversion, the colours then wrong; the median of the logged images/s after the first "
        "interval):",
        "",
        "| call | images per GPU | data | decoded into | steps | images/s | of synthetic |",
        "| ---: | ---: | --- | --- | ---: | ---: | ---: |",
    ]
    for r in runs:
        lines.append(
            f"| {r['call']} | {r['per_gpu']} | {r['data']} | {r['decoded_into'] or '-'} | "
            f"{r['steps']:,} | {r['images_per_s']:,.0f} | "
            f"{r['images_per_s'] / synthetic[r['per_gpu']]:.3f} |"
        )
    return "\n".join(lines)


def compute_runs_table(doc: dict[str, Any]) -> str:
    """The trainer's one-GPU rates by compute dtype from `scripts.bench.peers` runs of several
    checkouts in one call (`runs`, each its `code` and record), each against the first run's
    bf16 row at its batch."""
    runs = doc["runs"]
    bf16 = {
        r["per_device_batch"]: r["images_per_s"]
        for r in runs[0]["doc"]["results"]
        if r.get("compute") == "bfloat16" and r["kind"] == "trainer"
    }
    lines = [
        f"The trainer's step by compute dtype ({_environment(runs[0]['doc'])}; synthetic data; "
        "queued = one step in flight ahead; one call, the checkouts in turn):",
        "",
        "| code | compute | images per GPU | images/s queued | images/s synced | vs bf16 |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for run in runs:
        dtype = run["doc"]["args"]["compute_dtype"]  # a checkout's that ran one dtype a call
        for r in run["doc"]["results"]:
            if r["kind"] != "trainer" or "images_per_s" not in r:
                continue
            rate = r["images_per_s"]
            lines.append(
                f"| {run['code']} | {r.get('compute', dtype)} | {r['per_device_batch']} | "
                f"{rate:.0f} | {r['synced_images_per_s']:.0f} | "
                f"{rate / bf16[r['per_device_batch']]:.3f} |"
            )
    return "\n".join(lines)


def loss_scale_forms_table(doc: dict[str, Any]) -> str:
    """The fp16 step with each form of loss scaling's check and skip, in rounds (a probe)."""
    rows = doc["rows"]
    rounds = sorted({r["round"] for r in rows})
    lines = [
        f"The fp16 step by form of the check and the skip ({_environment(doc)}; ResNet-50 64K "
        "config, synthetic data; queued step ms, median of 30 steps; the forms in turn in each "
        "round):",
        "",
        "| form | images per GPU | kernels in the program |"
        + "".join(f" ms round {r + 1} |" for r in rounds),
        "| --- | ---: | ---: |" + " ---: |" * len(rounds),
    ]
    for form, batch in dict.fromkeys((r["variant"], r["per_device_batch"]) for r in rows):
        mine = {
            r["round"]: r for r in rows if (r["variant"], r["per_device_batch"]) == (form, batch)
        }
        lines.append(
            f"| {form} | {batch} | {mine[rounds[0]]['entry_kernels']} |"
            + "".join(f" {mine[r]['queued_ms']:.2f} |" for r in rounds)
        )
    return "\n".join(lines)


def table(path: str) -> str:
    """The table of one raw file, of whichever benchmark wrote it."""
    if path.endswith(".kernels.json.gz"):
        return breakdown_table(path)
    with open(path) as f:
        doc = json.load(f)
    if "log" in doc:
        return killed_table(path, doc)
    if "rows" in doc and "autotune_cache" in doc["rows"][0]:
        return graphs_capture_table(doc)
    if "runs" in doc and "convolution_graphs" in doc["runs"][0]:
        return graphs_runs_table(doc)
    if "runs" in doc and "statistics" in doc["runs"][0]:
        return bn_variance_table(doc)
    if "runs" in doc and "plan" in doc["runs"][0]:
        return second_stream_table(doc)
    if "runs" in doc and "collector" in doc["runs"][0]:
        return gc_runs_table(doc)
    if "runs" in doc and "decoded_into" in doc["runs"][0]:
        return planar_runs_table(doc)
    if "runs" in doc and {"code", "doc"} <= set(doc["runs"][0]):
        return compute_runs_table(doc)
    if "rows" in doc and "entry_kernels" in doc["rows"][0]:
        return loss_scale_forms_table(doc)
    first = (doc.get("results") or [{}])[0]
    if "action" in first and "traced_steps" in first:
        return second_stream_table(doc)
    if "load" in first and "round" in first:
        return contention_table(doc)
    if first.get("variant") == "alone" and "crop_kernel" in first:
        return crop_in_step_table(doc)
    if "op" in first and "channels" in first:
        return bn_reductions_table(doc)
    if "kernel" in first and "variant" in first:
        return cudnn_genstats_table(doc)
    if "in_channels" in first and "variant" in first:
        return conv_stats_table(doc)
    if "kinds" in first:
        return pack_fusion_table(doc)
    if "layout" in first:
        return overlap_table(doc)
    if "beside_training" in first:
        return decode_loaded_table(doc)
    if "synthetic_images_per_s" in first:
        return gpu_decode_table(doc)
    if "pack_after_backward" in first:
        return processes_pack_table(doc)
    if "hosts" in first:
        return hosts_table(doc)
    if "settings" in first:
        return link_table(doc)
    if "recoverable" in first:
        return repro_table(doc)
    if "gpus" in doc and "variant" in first:
        return train_input_table(doc)
    if "kind" in first:
        return peers_table(doc)
    if "variants" in doc:
        return step_table(doc)
    if "dataset" in doc:
        return input_table(doc)
    if "one_process" in doc:
        return multiprocess_table(doc)
    if doc["results"] and "schedule" in doc["results"][0]:
        return profile_table(doc)
    return allreduce_table(doc)
