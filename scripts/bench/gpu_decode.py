r"""The GPU input path (data.decode='gpu') on the generated JPEGs of scripts/bench/input.py.

Subcommands, each writing JSON (all but `report` write the dataset first, unless it is there):
  * `smoke`: the GPU path against the CPU path on the same images and parameters (a ResNet-18 at
    the training size, random initialisation): top-1 of each, the bound on their difference
    (`compare_predictions`), the pixels' difference, how many images the GPU decoder refused;
    and per kind of odd image (grey, CMYK, PNG, progressive, truncated JPEG) whether the GPU
    decodes it and how far its tile is from Pillow's.
  * `decode`: the decode stage alone (`gpu_input.device_batches`, as in training: tiles decoded
    into each GPU's tile ring, cropped and resized there; the host's records read beforehand;
    each batch waited for before the next), in images/s per GPU, on one GPU and on all of them
    at once; and nvImageCodec's whole-image decode of the same JPEGs, for reference, into each
    of --sample_formats, with its top kernels per image.
  * `loaded`: the decode stage on one GPU (the first --per_gpu) alone and while the trainer's
    ResNet-50 step (or --train_model's, in --train_compute_dtype) trains on that GPU in another
    thread, for each --decoder_options, batches not waited for one by one (as the trainer's
    input thread); each row has the training's images/s meanwhile and the ms a batch spent in
    each phase.
  * `contention`: what each half of the GPU path costs the train step's launch: the trainer's
    step (as `loaded` trains it) on one GPU at the first --per_gpu, alone (`none`) and beside
    each of --loads in turn, --rounds times, --load_seconds each: `records` (record batches
    read as the trainer reads them, --num_workers processes, no GPU work), `decode` (the decode
    stage over records read beforehand: this process's CUDA calls and the GPU's decoding, no
    reading), `both` (records read and decoded, as the trainer's input thread does) and, asked
    for alone, `other` (the decode stage in another process on the GPU, at most --other_rate
    images/s: a CUDA context of its own, `decode_loop`, so no decoder ever runs in this one). Each
    row has the step's images/s, the median ms a step spent in the step's call (the host's
    launch, the trainer's `launch N ms a step`) and the load's own images/s; with
    --trace_seconds, how the step's kernels followed one another in the row's first seconds;
    with several --contention_options, a decode and a both row for each. A row of round 0
    first trains the step alone before any decoder exists in the process.
  * `crop`: the crop-and-resize program alone (`crop_resize.crop_resize`, as the decode stage
    runs it after each batch's decode, on XLA's stream, so its time adds to the step's) on one
    GPU, for each --per_gpu and --crop_kernels (`crop_resize.resize_tiles`' `kernel`): ms a
    batch (best of --repeats) and its top kernels a batch, on tiles of the generated JPEGs'
    size with train crop windows.
  * `records`: the GPU path's host half alone, for each --per_gpu: record batches (encoded
    bytes, crop windows) read as the trainer reads them (`tfds_input.host_iterator`, 4 threads
    in each of --num_workers processes), in images/s over the second half of --record_seconds
    of reading after a warm-up, and the reading process's CPU ms a batch; no GPU work. Where
    the trainer waits for input, this says whether reading keeps up, or decoding does not.
  * `decode_loop`: `contention`'s `other` process (its input and output are the protocol of
    `_DecodeProcess`), not for use by hand.
  * `report`: the record of scripts/bench_gpu_decode.sh: one row per training configuration
    (`scripts.bench.train_input` JSONs) with the decode stage's rate beside it.

  python -m scripts.bench.gpu_decode smoke --data_dir=/tmp/jia_bench_data --out=smoke.json
  python -m scripts.bench.gpu_decode decode --data_dir=/tmp/jia_bench_data --out=stage.json
  python -m scripts.bench.gpu_decode loaded --per_gpu 256 --out=loaded.json
  python -m scripts.bench.gpu_decode contention --per_gpu 64 --num_workers 8 --out=contention.json
  python -m scripts.bench.gpu_decode contention --per_gpu 64 --loads decode --rounds 1 \
      --trace_seconds 1 --out=contention.json
  python -m scripts.bench.gpu_decode contention --per_gpu 64 --loads other --other_rate 6000 \
      --rounds 2 --trace_seconds 1 --out=contention.json
  python -m scripts.bench.gpu_decode crop --per_gpu 256 64 --out=crop.json
  python -m scripts.bench.gpu_decode records --per_gpu 256 64 --num_workers 8 --out=records.json
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import io
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from jia_jax.crop_resize import DEFAULT_KERNEL as DEFAULT_CROP_KERNEL
from jia_jax.crop_resize import KERNELS as CROP_KERNELS
from scripts.bench import harness, step_thread

_NAME = "jia_bench_jpeg"
# Record batches read before `records` starts its clock: the worker processes start and fill
# their buffers meanwhile.
_RECORD_WARMUP = 3
# nvImageCodec's hardware JPEG decoder with its buffers sized up front for a batch of 256 images of
# up to 512 x 512 (by default it sizes them for one 1 x 1 image and grows them as batches come).
_PREALLOCATED = " ".join(
    f"nvjpeg_hw_decoder:{k}={v}"
    for k, v in (("preallocate_batch_size", 256), ("preallocate_width_hint", 512),
                 ("preallocate_height_hint", 512))
)


def compare_predictions(
    cpu_logits: np.ndarray, gpu_logits: np.ndarray, labels: np.ndarray, mask: np.ndarray
) -> dict[str, Any]:
    """Top-1 of the two paths' logits over the real examples (mask 1), and its bound.

    If no logit moves by more than c between the paths, a prediction can change only where the
    CPU path's margin (top logit minus the next) is at most 2c: the old top must fall and a
    rival rise to meet it. So |top-1 difference| <= (examples with margin <= 2c) / examples.
    """
    real = mask > 0
    cpu_logits, gpu_logits, labels = cpu_logits[real], gpu_logits[real], labels[real]
    change = float(np.abs(gpu_logits - cpu_logits).max())
    top2 = np.sort(cpu_logits, axis=1)[:, -2:]
    near = top2[:, 1] - top2[:, 0] <= 2 * change
    cpu_top, gpu_top = cpu_logits.argmax(1), gpu_logits.argmax(1)
    changed = cpu_top != gpu_top
    top1_cpu, top1_gpu = float(np.mean(cpu_top == labels)), float(np.mean(gpu_top == labels))
    bound = float(np.mean(near))
    return {
        "examples": int(real.sum()),
        "top1_cpu": top1_cpu,
        "top1_gpu": top1_gpu,
        "predictions_changed": int(changed.sum()),
        "max_logit_change": change,
        "top1_bound": bound,
        "bound_holds": bool(np.all(near[changed]) and abs(top1_gpu - top1_cpu) <= bound),
    }


def pixel_change(cpu_images: np.ndarray, gpu_images: np.ndarray, mask: np.ndarray) -> dict:
    """Largest and mean |difference| of the two paths' uint8 images over the real examples."""
    real = mask > 0
    diff = np.abs(gpu_images[real].astype(np.int32) - cpu_images[real])
    return {"max_pixel_change": int(diff.max()), "mean_pixel_change": float(diff.mean())}


def _data_config(args: argparse.Namespace, decode: str, eval_split: str):
    from configs import default  # pylint: disable=import-outside-toplevel

    data = default.get_config().data
    data.update(
        name=_NAME,
        data_dir=os.path.join(args.data_dir, "array_record"),
        image_size=args.image_size,
        decode=decode,
        gpu_canvas=args.canvas,
        eval_split=eval_split,
        num_workers=args.num_workers,
    )
    return data


def _eval_pass(args: argparse.Namespace, decode: str, mesh) -> dict[str, np.ndarray]:
    from jia_jax import input_pipeline  # pylint: disable=import-outside-toplevel

    data = _data_config(args, decode, f"train[:{args.images}]")
    stream = input_pipeline.create_input(data, args.batch, args.batch, mesh, 0)
    batches = [{k: np.asarray(v) for k, v in b.items()} for b in stream.eval()]
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


def _odd_images(decoder, canvas: int) -> list[dict[str, Any]]:
    """Each kind of odd record, decoded by `decoder` (a `gpu_input.DeviceDecoder`) whole and as
    a region of interest (the two ways the GPU path decodes), against Pillow."""
    import PIL.Image  # pylint: disable=import-outside-toplevel

    from jia_jax import gpu_decode  # pylint: disable=import-outside-toplevel

    rng = np.random.default_rng(0)
    coarse = PIL.Image.fromarray(rng.integers(0, 256, (12, 16, 3), dtype=np.uint8))
    image = coarse.resize((500, 375), PIL.Image.BICUBIC)

    def encode(im, fmt="JPEG", **options):
        out = io.BytesIO()
        im.save(out, format=fmt, **options)
        return out.getvalue()

    baseline = encode(image, quality=90)
    kinds = {
        "rgb": baseline,
        "grey": encode(image.convert("L"), quality=90),
        "cmyk": encode(image.convert("CMYK"), quality=90),
        "png": encode(image, "PNG"),
        "progressive": encode(image, quality=90, progressive=True),
        "truncated": baseline[: len(baseline) * 2 // 3],
    }
    # Whole where the image fits in a canvas, and a region at an inner origin, each clipped to
    # the image and to the canvas as `crop_resize.plan_tiles` clips them.
    origins = np.array([[0, 0], [100, 200]])
    regions = np.concatenate([origins, np.minimum(origins + canvas, [375, 500])], axis=1)
    rows = []
    for kind, encoded in kinds.items():
        data = np.frombuffer(encoded, np.uint8)
        tiles = gpu_decode.new_tiles(decoder.device, len(regions), canvas)
        decoded = decoder.decode([data, data], regions, tiles)
        row: dict[str, Any] = {"kind": kind, "decoded_on_gpu": decoded.tolist()}
        try:
            pixels = np.asarray(PIL.Image.open(io.BytesIO(encoded)).convert("RGB"))
        except OSError as e:
            row["pillow"] = f"{type(e).__name__}: {e}"
            rows.append(row)
            continue
        diffs = []
        for tile, (top, left, bottom, right), ok in zip(np.asarray(tiles), regions, decoded):
            if ok:
                got = tile[: bottom - top, : right - left].astype(np.int32)
                diffs.append(np.abs(got - pixels[top:bottom, left:right]))
        if diffs:
            row["max_diff_vs_pillow"] = int(max(d.max() for d in diffs))
            row["mean_diff_vs_pillow"] = float(np.mean([d.mean() for d in diffs]))
        rows.append(row)
    return rows


def smoke(args: argparse.Namespace) -> dict[str, Any]:
    """The GPU path's eval against the CPU path's on one device (see the module docstring)."""
    import jax  # pylint: disable=import-outside-toplevel
    import jax.numpy as jnp  # pylint: disable=import-outside-toplevel

    # pylint: disable=import-outside-toplevel
    from jia_jax import gpu_input, models, normalize, record_batches, tfds_input
    from jia_jax import mesh as mesh_lib

    device = jax.local_devices()[0]
    mesh = mesh_lib.create_mesh(1, 1, [device])
    gpu, cpu = _eval_pass(args, "gpu", mesh), _eval_pass(args, "cpu", mesh)
    model = models.create_model("resnet18", num_classes=1000, width=16, dtype=jnp.float32)
    shape = (1, args.image_size, args.image_size, 3)
    variables = jax.jit(lambda k: model.init(k, jnp.zeros(shape), train=False))(jax.random.key(0))

    @jax.jit
    def apply(images):
        return model.apply(variables, normalize.model_input(images, jnp.float32), train=False)

    def logits(images):
        return np.concatenate([apply(images[i : i + 64]) for i in range(0, len(images), 64)])

    result = compare_predictions(
        logits(cpu["image"]), logits(gpu["image"]), cpu["label"], cpu["mask"]
    )
    result |= pixel_change(cpu["image"], gpu["image"], cpu["mask"])
    result["labels_equal"] = bool(np.array_equal(cpu["label"], gpu["label"]))
    # How many of the dataset's images the GPU decoder refused (they went to Pillow).
    data = _data_config(args, "gpu", f"train[:{args.images}]")
    decoder = gpu_input.device_decoders([device])[device]
    part = tfds_input.process_part(
        _NAME, data.data_dir, data.eval_split, 0, 1, drop_remainder=False
    )
    records = record_batches.eval_batches(
        part, local_batch=args.batch, num_batches=-(-args.images // args.batch)
    )
    refused = 0
    for k in range(len(records)):
        decoded = gpu_input.decode_rows(
            records[k], slice(0, args.batch), decoder, args.image_size, data.gpu_canvas
        )
        refused += len(decoded[1])
    result["refused_by_gpu_decoder"] = refused
    result["odd_images"] = _odd_images(decoder, data.gpu_canvas)
    return result


def _train_records(args: argparse.Namespace, local_batch: int):
    """The generated dataset's train record batches (`record_batches.train_batches`, a
    `grain.MapDataset`), as one process of one reads them."""
    from jia_jax import record_batches, tfds_input  # pylint: disable=import-outside-toplevel

    data_dir = os.path.join(args.data_dir, "array_record")
    part = tfds_input.process_part(_NAME, data_dir, "train", 0, 1, drop_remainder=True)
    return record_batches.train_batches(
        part, local_batch=local_batch, seed=0, start_step=0, process_index=0
    )


def _record_batches(args: argparse.Namespace, local_batch: int, count: int) -> list[dict]:
    """`count` train record batches of the generated dataset, read into memory."""
    batches = _train_records(args, local_batch)
    return [batches[k] for k in range(count)]


def _stage_rate(
    records: list[dict], decoders, args: argparse.Namespace, canvas: int, wait_each: bool = True
) -> float:
    """Images/s per GPU of `gpu_input.device_batches` over `records` with the decoder sets
    `decoders`, after a warm-up pass; each batch waited for before the next if `wait_each`, else
    only the last (the trainer's input thread waits for none: only its tile ring waits, for the
    crop that last read an array)."""

    def run(batches: list[dict]) -> None:
        _decode_batches(iter(batches), decoders, args.image_size, canvas, wait_each)

    run(records)  # compiles each tile count
    start = time.perf_counter()
    run(records * args.repeats)
    seconds = time.perf_counter() - start
    per_gpu = decoders[0][0][1].stop - decoders[0][0][1].start
    return per_gpu * len(records) * args.repeats / seconds


def _decode_batches(
    batches: Iterator[dict], decoders, image_size: int, canvas: int, wait_each: bool
) -> int:
    """The images `gpu_input.device_batches` decodes from `batches` with the decoder sets
    `decoders`; each batch waited for before the next if `wait_each`, else only the last."""
    import jax  # pylint: disable=import-outside-toplevel

    from jia_jax import gpu_input  # pylint: disable=import-outside-toplevel

    def refuse(position: int) -> dict:
        raise RuntimeError(f"the GPU decoder refused example {position} of generated JPEGs")

    outputs = gpu_input.device_batches(
        batches, decoders, refuse, first_step=0, image_size=image_size, canvas=canvas
    )
    images, out = 0, None
    for out in outputs:
        images += sum(part.shape[0] for part in out["image"])
        if wait_each:
            jax.block_until_ready(out["image"])
    if out is not None:
        jax.block_until_ready(out["image"])
    return images


def _whole_image_decode(
    records: list[dict], device, per_gpu: int, sample_format: str
) -> Callable[[], None]:
    """One call of nvImageCodec's whole-image decode of the same JPEGs (lists of `per_gpu`) on
    its hardware decoder, into `sample_format` (a `nvimgcodec.SampleFormat` name), waited for."""
    import jax  # pylint: disable=import-outside-toplevel
    from nvidia import nvimgcodec  # pylint: disable=import-outside-toplevel

    decoder = nvimgcodec.Decoder(
        device_id=device.local_hardware_id,
        backends=[nvimgcodec.Backend(nvimgcodec.BackendKind.HW_GPU_ONLY)],
    )
    params = nvimgcodec.DecodeParams(
        apply_exif_orientation=False, sample_format=getattr(nvimgcodec.SampleFormat, sample_format)
    )
    batch = records[0]
    offsets = batch["offsets"]
    encoded = [batch["encoded"][offsets[i] : offsets[i + 1]] for i in range(per_gpu)]
    streams = [nvimgcodec.CodeStream(e) for e in encoded]

    def decode() -> None:
        images = decoder.decode(streams, params=params)
        refused = sum(im is None for im in images)
        if refused:  # from_dlpack(None) would fail with a message about DLPack
            raise RuntimeError(f"the hardware decoder refused {refused} of {per_gpu} JPEGs")
        jax.block_until_ready([jax.dlpack.from_dlpack(im) for im in images])

    return decode


def _best_rate(decode: Callable[[], None], per_call: int, repeats: int) -> float:
    """Images/s of `decode` (`per_call` images a call), best of `repeats` calls."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        decode()
        best = min(best, time.perf_counter() - start)
    return per_call / best


def _top_kernels(
    decode: Callable[[], None], per_call: int, n: int = 3
) -> list[dict[str, Any]]:
    """The `n` kernels of one traced call of `decode` with the most time, per image (per call
    if `per_call` is 1): a decoder's own kernels (its colour conversion) run on the SMs the
    train step needs."""
    from scripts.bench import profile_trace  # pylint: disable=import-outside-toplevel

    _, traced = step_thread.traced_kernels(decode)
    kernels = [k for ks in traced.values() for k in ks]
    return profile_trace.top_kernels(kernels, per_call, n=n)


def steady_rate(stamps: Sequence[tuple[float, int]]) -> tuple[int, float]:
    """(images, images/s) over the second half of a timed read: `stamps` are (seconds since the
    clock started, images of the batch read then), in order. The first half goes: in it the
    workers hand over batches they read while the clock was not yet running.

    Raises:
      ValueError: fewer than two batches arrive in the second half.
    """
    first = _second_half(stamps)
    images = sum(n for _, n in stamps[first + 1 :])
    return images, images / (stamps[-1][0] - stamps[first][0])


def steady_cpu_ms(stamps: Sequence[tuple[float, int]], cpu_s: Sequence[float]) -> float:
    """This process's CPU ms a batch (all its threads, user and system) over the same second
    half as `steady_rate`; `cpu_s[i]` is its CPU seconds when batch i arrived."""
    first = _second_half(stamps)
    return 1e3 * (cpu_s[-1] - cpu_s[first]) / (len(stamps) - first - 1)


def _second_half(stamps: Sequence[tuple[float, int]]) -> int:
    """The index of the first stamp of the second half of the time (see `steady_rate`)."""
    first = next(i for i, (t, _) in enumerate(stamps) if t >= stamps[-1][0] / 2)
    if len(stamps) - first < 2:
        raise ValueError(f"{len(stamps) - first} batches in the second half: read for longer.")
    return first


def records(args: argparse.Namespace) -> dict[str, Any]:
    """Images/s of the host half alone per --per_gpu (see `records` above), read for
    --record_seconds after `_RECORD_WARMUP` batches (the workers' start), over the second half
    of that time (`steady_rate`), with this process's CPU ms a batch (`steady_cpu_ms`: what the
    reading costs the training process, beside its workers' own)."""
    from jia_jax import record_batches, tfds_input  # pylint: disable=import-outside-toplevel

    rows = []
    for per_gpu in args.per_gpu:
        stream = tfds_input.host_iterator(_train_records(args, per_gpu), num_threads=4,
                                          num_workers=args.num_workers)
        for _ in range(_RECORD_WARMUP):
            next(stream)
        start, stamps, cpu_s = time.perf_counter(), [], []
        while not stamps or stamps[-1][0] < args.record_seconds:
            images = len(next(stream)[record_batches.FLIP])
            stamps.append((time.perf_counter() - start, images))
            cpu_s.append(time.process_time())
        images, rate = steady_rate(stamps)
        rows.append({
            "per_gpu": per_gpu,
            "num_workers": args.num_workers,
            "seconds": args.record_seconds,
            "images": images,
            "records_images_per_s": rate,
            "host_cpu_ms_per_batch": steady_cpu_ms(stamps, cpu_s),
        })
        del stream  # stops its worker processes before the next batch size starts its own
    return {"results": rows}


def decode_stage(args: argparse.Namespace) -> dict[str, Any]:
    """The decode stage's images/s per GPU, on one GPU and on all local GPUs at once."""
    import jax  # pylint: disable=import-outside-toplevel

    from jia_jax import gpu_input  # pylint: disable=import-outside-toplevel

    all_devices = jax.local_devices()
    canvas = args.canvas
    decoders = [gpu_input.device_decoders(all_devices) for _ in range(max(args.depth))]
    rows = []
    for per_gpu, depth in itertools.product(args.per_gpu, args.depth):
        for gpus in sorted({1, len(all_devices)}):
            records = _record_batches(args, per_gpu * gpus, args.batches)
            devices = all_devices[:gpus]
            placed = [
                [(s[d], slice(k * per_gpu, (k + 1) * per_gpu)) for k, d in enumerate(devices)]
                for s in decoders[:depth]
            ]
            rate = functools.partial(_stage_rate, records, placed, args, canvas)
            row = {"per_gpu": per_gpu, "gpus": gpus, "depth": depth}
            rows.append(_measured(row, "decode_images_per_s", rate))
    for per_gpu, sample_format in itertools.product(args.per_gpu, args.sample_formats):
        if all_devices[0].platform == "gpu":  # not where a stand-in decodes on the CPU (tests)
            records = _record_batches(args, per_gpu, args.batches)
            row = {"per_gpu": per_gpu, "gpus": 1, "sample_format": sample_format}
            try:
                decode = _whole_image_decode(records, all_devices[0], per_gpu, sample_format)
            except Exception as e:  # pylint: disable=broad-except
                rows.append({**row, "error": harness.error_text(e)})  # the others still run
                continue
            rate = functools.partial(_best_rate, decode, per_gpu, args.repeats)
            rows.append(_measured(row, "whole_image_decode_images_per_s", rate))
            if "error" not in row:
                kernels = functools.partial(_top_kernels, decode, per_gpu)
                _measured(row, "kernels_per_image", kernels)
    return {"canvas": canvas, "image_size": args.image_size, "results": rows}


def crop(args: argparse.Namespace) -> dict[str, Any]:
    """ms a batch and top kernels of the crop-and-resize program on one GPU (see `crop` above)."""
    import jax  # pylint: disable=import-outside-toplevel

    from jia_jax import crop_resize  # pylint: disable=import-outside-toplevel
    from scripts.bench import crop_in_step  # pylint: disable=import-outside-toplevel

    device, rows = jax.local_devices()[0], []
    for per_gpu in args.per_gpu:
        inputs = crop_in_step.crop_inputs(per_gpu, args.image_size, args.canvas)
        one_tile_each = inputs.pop("one_tile_each")
        tiles, example, params = jax.device_put(
            (inputs["tiles"], inputs["example"], inputs["params"]), device
        )
        for kernel in args.crop_kernels:
            program = functools.partial(
                crop_resize.crop_resize, batch=per_gpu, image_size=args.image_size,
                one_tile_each=one_tile_each, kernel=kernel,
            )
            row = {"per_gpu": per_gpu, "tiles": len(inputs["example"]), "kernel": kernel}
            rows.append(_time_crop(row, program, tiles, example, params, args.repeats))
    return {"canvas": args.canvas, "image_size": args.image_size, "results": rows}


def _time_crop(row: dict, program, tiles, example, params, repeats: int) -> dict[str, Any]:
    """`row` with the crop program's batches a second (best of `repeats`), ms a batch and its
    top kernels, or the error that stopped it."""
    import jax  # pylint: disable=import-outside-toplevel

    def run() -> None:
        jax.block_until_ready(program(tiles, example, params))

    _measured(row, "compile_s", functools.partial(_seconds, run))
    if "error" not in row:
        _measured(row, "batches_per_s", functools.partial(_best_rate, run, 1, repeats))
    if "error" not in row:
        row["ms_per_batch"] = 1e3 / row["batches_per_s"]
        _measured(row, "kernels_per_batch", functools.partial(_top_kernels, run, 1, 8))
    return row


def _seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def loaded(args: argparse.Namespace) -> dict[str, Any]:
    """The decode stage on one GPU, alone and while the trainer's ResNet-50 step (or
    `--train_model`'s) trains on the same GPU in another thread (synthetic data), for each of
    `--decoder_options` (nvImageCodec's options for the decoders, besides the trainer's own):
    whether decoding beside training is slower than alone, and in which phase of a batch.
    Batches are not waited for one by one (a batch's crop runs behind the train steps already
    queued), as in the trainer's input thread."""
    import jax  # pylint: disable=import-outside-toplevel

    from jia_jax import gpu_decode, gpu_input, tile_ring  # pylint: disable=import-outside-toplevel

    device, per_gpu = jax.local_devices()[0], args.per_gpu[0]
    records = _record_batches(args, per_gpu, args.batches)
    rows = []
    with step_thread.training(device, per_gpu, args) as train_times, _phase_timer() as phases:
        for options, depth in itertools.product(args.decoder_options, args.depth):
            placed = [
                [(gpu_input.DeviceDecoder(device, gpu_decode.new_decoder(device, options=options),
                                          tile_ring.TileRing(device)), slice(0, per_gpu))]
                for _ in range(depth)
            ]
            for beside_training in (False, True):
                row = {"per_gpu": per_gpu, "decoder_options": options, "depth": depth,
                       "beside_training": beside_training}
                train_times.run(beside_training)
                start, before = time.perf_counter(), len(train_times)
                phases.clear()
                rate = functools.partial(
                    _stage_rate, records, placed, args, args.canvas, wait_each=False
                )
                rows.append(_measured(row, "decode_images_per_s", rate))
                steps = len(train_times) - before
                row["train_images_per_s"] = per_gpu * steps / (time.perf_counter() - start)
                batches = args.batches * (args.repeats + 1)
                row["ms_per_batch"] = {k: 1e3 * v / batches for k, v in phases.items()}
    return {
        "canvas": args.canvas,
        "image_size": args.image_size,
        "waited_for": "the last batch of each pass",
        "results": rows,
    }


LOADS = ("records", "decode", "both", "other")


def contention(args: argparse.Namespace) -> dict[str, Any]:
    """The train step's rate and launch alone and beside each load (see `contention` above).
    Round 0 is the step alone before any decoder exists in the process (a decoder's start-up
    check runs kernels on its own streams already)."""
    import jax  # pylint: disable=import-outside-toplevel

    from jia_jax import gpu_input, tfds_input  # pylint: disable=import-outside-toplevel

    device, per_gpu = jax.local_devices()[0], args.per_gpu[0]
    records = _record_batches(args, per_gpu, args.batches)
    # Started once: its workers wait, their buffers full, while other rows run.
    stream = tfds_input.host_iterator(_train_records(args, per_gpu), num_threads=4,
                                      num_workers=args.num_workers)
    for _ in range(_RECORD_WARMUP):
        next(stream)
    with (step_thread.training(device, per_gpu, args) as train_times,
          contextlib.ExitStack() as on_exit):
        rows = [_contention_row(("none", None), _idle_for, 0, per_gpu, args, train_times)]
        in_process = {"decode", "both"} & set(args.loads)  # loads that decode in this process
        decoders = {
            options: [[(gpu_input.device_decoders([device], options=options)[device],
                        slice(0, per_gpu))]]
            for options in (args.contention_options if in_process else [])
        }
        for placed in decoders.values():  # compiles the crop before the next row
            _stage_rate(records, placed, args, args.canvas)
        loads: dict[tuple[str, str | None], Callable[[float], int]] = {
            ("none", None): _idle_for, ("records", None): functools.partial(_read_for, stream)}
        for options, placed in decoders.items():
            loads["decode", options] = functools.partial(
                _decode_for, itertools.cycle(records), placed, args)
            loads["both", options] = functools.partial(_decode_for, stream, placed, args)
        if "other" in args.loads:
            loads["other", None] = on_exit.enter_context(_DecodeProcess(args, per_gpu))
        chosen = [key for key in loads if key[0] in ("none", *args.loads)]
        for round_, key in itertools.product(range(1, args.rounds + 1), chosen):
            rows.append(_contention_row(key, loads[key], round_, per_gpu, args, train_times))
    return {"seconds_per_row": args.load_seconds, "results": rows}


def _contention_row(
    key: tuple[str, str | None],
    load: Callable[[float], int],
    round_: int,
    per_gpu: int,
    args: argparse.Namespace,
    train_times: step_thread.StepTimes,
) -> dict[str, Any]:
    """One row of `contention`: the step trained beside `load` (named and with the decoders'
    options of `key`) for --load_seconds."""
    name, options = key
    row: dict[str, Any] = {"per_gpu": per_gpu, "load": name, "round": round_}
    if options is not None and args.contention_options != [""]:
        row["decoder_options"] = options
    train_times.run(True)
    first, start = len(train_times), time.perf_counter()
    images = _loaded_for(load, args, train_times, row)
    seconds = time.perf_counter() - start
    last = len(train_times)
    train_times.run(False)
    row["seconds"] = seconds  # past --load_seconds by the batch then under way
    row["train_images_per_s"] = per_gpu * (last - first) / seconds
    row["train_launch_ms"] = 1e3 * statistics.median(train_times.calls[first:last])
    if name != "none":
        row["load_images"] = images
        row["load_images_per_s"] = images / seconds
    print(row, flush=True)
    return row


def _loaded_for(
    load: Callable[[float], int],
    args: argparse.Namespace,
    train_times: step_thread.StepTimes,
    row: dict,
) -> int:
    """Images of `load` over --load_seconds, the first --trace_seconds of them traced (if any)
    into `row`: the steps finished meanwhile (`traced_steps`) and how the kernels of the step's
    stream followed one another then (`boundaries`, `profile_trace.stream_boundaries` per step;
    None where the trace holds no GPU kernels)."""
    traced = min(args.trace_seconds, args.load_seconds)
    if traced <= 0:
        return load(args.load_seconds)
    images, row["traced_steps"], row["boundaries"] = step_thread.traced_steps(
        train_times, lambda: load(traced))
    return images + load(args.load_seconds - traced)


def _idle_for(seconds: float) -> int:
    """No load: the step alone for `seconds`."""
    time.sleep(seconds)
    return 0


def _read_for(stream: Iterator[dict], seconds: float) -> int:
    """Images of the record batches read from `stream` in `seconds`."""
    from jia_jax import record_batches  # pylint: disable=import-outside-toplevel

    images, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        images += len(next(stream)[record_batches.FLIP])
    return images


def _decode_for(
    batches: Iterator[dict], decoders, args: argparse.Namespace, seconds: float
) -> int:
    """Images decoded on the GPU from `batches` in `seconds` (the last batch waited for), each
    batch's decode not waited for one by one, as the trainer's input thread."""
    end = time.perf_counter() + seconds

    def until_time() -> Iterator[dict]:
        while time.perf_counter() < end:
            yield next(batches)

    return _decode_batches(until_time(), decoders, args.image_size, args.canvas, wait_each=False)


class _DecodeProcess:
    """The decode stage (`_decode_for`) in another process on this GPU, a CUDA context of its
    own: this script's `decode_loop`, driven over its standard input and output. Called with
    seconds, it decodes for that long there and returns the images decoded."""

    def __init__(self, args: argparse.Namespace, per_gpu: int) -> None:
        env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}  # beside this process's
        self._child = subprocess.Popen(
            _decode_loop_argv(args, per_gpu), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, env=env)
        self._reply("ready")

    def __enter__(self) -> "_DecodeProcess":
        return self

    def __exit__(self, *_) -> None:
        self._child.stdin.close()  # the loop ends at the end of its input
        self._child.wait(timeout=120)

    def __call__(self, seconds: float) -> int:
        self._child.stdin.write(f"{seconds}\n")
        self._child.stdin.flush()
        return self._reply("images")

    def _reply(self, key: str) -> Any:
        for line in self._child.stdout:
            if line.startswith("{") and key in (message := json.loads(line)):
                return message[key]
        raise RuntimeError(
            f"the decode process ended (exit {self._child.wait()}) before its {key!r} line")


def _decode_loop_argv(args: argparse.Namespace, per_gpu: int) -> list[str]:
    """The command of `_DecodeProcess`'s child: `decode_loop` on this run's dataset."""
    return [sys.executable, "-m", "scripts.bench.gpu_decode", "decode_loop",
            f"--data_dir={args.data_dir}", f"--num_images={args.num_images}",
            f"--image_size={args.image_size}", f"--canvas={args.canvas}", "--per_gpu",
            str(per_gpu), f"--batches={args.batches}", f"--repeats={args.repeats}",
            f"--other_rate={args.other_rate}"]


def decode_loop(args: argparse.Namespace, lines: Iterator[str], out) -> None:
    """`_DecodeProcess`'s child: builds a decoder on the first GPU and decodes one pass over
    --batches record batches (the crop compiled), writes {"ready": true} to `out`, then for each
    line of `lines` (seconds) decodes for that long, at most --other_rate images/s if set, and
    writes {"images": n}."""
    import jax  # pylint: disable=import-outside-toplevel

    from jia_jax import gpu_input  # pylint: disable=import-outside-toplevel

    device, per_gpu = jax.local_devices()[0], args.per_gpu[0]
    records = _record_batches(args, per_gpu, args.batches)
    placed = [[(gpu_input.device_decoders([device])[device], slice(0, per_gpu))]]
    _decode_batches(iter(records), placed, args.image_size, args.canvas, wait_each=False)
    print(json.dumps({"ready": True}), file=out, flush=True)
    batches = itertools.cycle(records)
    for line in lines:
        paced = _paced(batches, per_gpu, args.other_rate)
        images = _decode_for(paced, placed, args, float(line))
        print(json.dumps({"images": images}), file=out, flush=True)


def _paced(batches: Iterator[dict], per_gpu: int, rate: float) -> Iterator[dict]:
    """`batches`, each handed out no sooner than `rate` images/s allow from the first (all at
    once where `rate` is 0)."""
    start = time.perf_counter()
    for n, batch in enumerate(batches):
        if rate > 0:
            time.sleep(max(start + n * per_gpu / rate - time.perf_counter(), 0.0))
        yield batch


@contextlib.contextmanager
def _phase_timer() -> Iterator[dict[str, float]]:
    """Seconds spent in each phase of a decoded batch (jia_jax/gpu_input.py), summed over
    threads while the block runs: the ring's wait, the code streams' parsing, nvImageCodec's
    decode calls, the wait for the decoder's stream, the crop's dispatch, and `decode_rows` as a
    whole (the rest of it: the plan and the uploads)."""
    # pylint: disable-next=import-outside-toplevel
    from jia_jax import crop_resize, cuda_stream, gpu_decode, gpu_input, tile_ring

    spent: dict[str, float] = {}
    targets = [
        ("ring_take", tile_ring.TileRing, "take"),
        ("code_streams", gpu_decode.NvImageCodecDecoder, "_code_stream"),
        ("nvimgcodec_decode", gpu_decode.NvImageCodecDecoder, "_into"),
        ("stream_sync", cuda_stream.CudaStream, "synchronize"),
        ("crop_dispatch", crop_resize, "crop_resize"),
        ("decode_rows", gpu_input, "decode_rows"),
    ]
    originals = [(owner, name, getattr(owner, name)) for _, owner, name in targets]

    def timed(key: str, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*a, **k):
            start = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[key] = spent.get(key, 0.0) + time.perf_counter() - start

        return wrapper

    for (key, owner, name), (_, _, fn) in zip(targets, originals, strict=True):
        setattr(owner, name, timed(key, fn))
    try:
        yield spent
    finally:
        for owner, name, fn in originals:
            setattr(owner, name, fn)


def _measured(row: dict[str, Any], key: str, measure: Callable[[], float]) -> dict[str, Any]:
    """`row` with `measure()` under `key`, or its error: one failed row does not lose the rest."""
    try:
        row[key] = measure()
    except Exception as e:  # pylint: disable=broad-except
        row["error"] = harness.error_text(e)
    print(row, flush=True)
    return row


def report(args: argparse.Namespace) -> dict[str, Any]:
    """One row per training configuration (GPUs, images per GPU, processes) of the `train_input`
    JSONs: the GPU path's images/s against synthetic data's, with the decode stage's rate beside
    it; the runs themselves (commands, logged intervals, log tails) kept under `runs`."""
    try:
        with open(args.stage) as f:
            stage = json.load(f)
    except OSError as e:  # the decode stage failed: the runs still have their rows
        stage = {"error": str(e), "results": []}
    rates = {
        (r["per_gpu"], r["gpus"], r.get("depth", 1)): r["decode_images_per_s"]
        for r in stage["results"]
        if "decode_images_per_s" in r
    }
    runs, configs, rounds = [], {}, collections.Counter()
    for path in args.runs:
        with open(path) as f:
            run = json.load(f)
        runs.append(run)
        # Records written before train_input's --processes ran one process.
        key = (run["gpus"], run["args"]["per_gpu"], run.get("processes", 1))
        overrides, workers = run["args"].get("override", []), run["args"].get("num_workers")
        # Processes bound to their own cores (train_input --bind of commit 1cd1af4, removed
        # since: it gained nothing; other records: unbound).
        bound = run["args"].get("bind", False)
        # What started several processes: launch_local.sh ("launch_local"; records from before
        # train_input's --launcher say nothing) or jia_jax.main itself ("main").
        launcher = run.get("launcher") or ("launch_local" if key[2] > 1 else "")
        setting = (*decode_setting(overrides), workers, bound, launcher)
        # XLA flags given to the trainers alone (train_input --xla_flags) change the step itself:
        # the GPU path's runs are against synthetic runs given the same.
        flags = run["args"].get("xla_flags") or ""
        for r in run["results"]:
            # Synthetic runs decode nothing: one baseline for every setting. A setting run again
            # is its next round.
            slot = (*key, flags, *(setting if r["variant"] == "gpu" else _SYNTHETIC_SETTING))
            rounds[slot, r["variant"]] += 1
            entry = configs.setdefault((*slot, rounds[slot, r["variant"]]), {})
            entry[r["variant"]] = {**r, "cores": run["cores"]}
    # A configuration of synthetic runs only is another row's baseline, not a row of its own.
    shown = [k for k, v in configs.items() if "gpu" in v or "synthetic" not in v]
    rows = [
        _report_row(key, configs, rates.get((key[1], key[0], key[4])))
        for key in sorted(shown, key=lambda k: (k[0], -k[1], *k[2:]))
    ]
    return {
        "environment": stage.get("environment") or runs[0]["environment"],
        "command": " ".join(sys.argv),
        "results": rows,
        "decode_stage": stage,
        "runs": runs,
    }


# The decode setting (depth, crop kernel, chroma, decoder options, workers, bound, launcher) of
# every synthetic run's slot.
_SYNTHETIC_SETTING = (0, "", "", "", None, False, "")


def decode_setting(overrides: Sequence[str]) -> tuple[int, str, str, str]:
    """`data.gpu_decode_depth`, `data.gpu_crop_kernel`, the chroma upsampling
    (`data.gpu_fancy_upsampling`: "interpolated" or "repeated") and nvImageCodec's decoder options
    (`data.gpu_decoder_options`) as a run's `--config` overrides set them (the last wins), else
    their defaults."""
    depth, kernel, chroma, options = 1, DEFAULT_CROP_KERNEL, "interpolated", ""
    for override in overrides:
        name, _, value = override.partition("=")
        value = value.strip("'\"")
        if name == "--config.data.gpu_decode_depth":
            depth = int(value)
        elif name == "--config.data.gpu_crop_kernel":
            kernel = value
        elif name == "--config.data.gpu_fancy_upsampling":
            chroma = "interpolated" if value.lower() in ("true", "1") else "repeated"
        elif name == "--config.data.gpu_decoder_options":
            options = value
    return depth, kernel, chroma, options


def _report_row(
    key: tuple[int, int, int, str, int, str, str, str, int | None, bool, str, int],
    configs: dict[tuple, dict],
    decode_rate: float | None,
) -> dict[str, Any]:
    """The GPU path's row of one (GPUs, images per GPU, processes, the trainers' XLA flags,
    decode depth, crop kernel, chroma upsampling, decoder options, input workers, processes bound
    to their cores, what started them, round).
    Its synthetic baseline is the unbound run of as many processes, else of one, given the same
    XLA flags: the step's own speed in the trainer's fastest form; of the same round where there
    is one, else the first."""
    gpus, per_gpu, processes, flags, depth, kernel, chroma, options, workers, bound, launcher, \
        round_ = key

    def baseline(p: int) -> dict:
        runs = [configs.get((gpus, per_gpu, p, flags, *_SYNTHETIC_SETTING, r), {})
                for r in (round_, 1)]
        return next((c["synthetic"] for c in runs if "synthetic" in c), {})

    synthetic_processes = next((p for p in (processes, 1) if baseline(p)), processes)
    synthetic = baseline(synthetic_processes)
    gpu = configs[key].get("gpu", {})
    row = {
        "gpus": gpus,
        "processes": processes,
        "cores": gpu.get("cores"),
        "per_gpu": per_gpu,
        "depth": depth,
        "crop_kernel": kernel,
        "chroma": chroma,
        "decoder_options": options,
        "workers": workers,
        "bound": bound,
        "round": round_,
        "decode": "gpu",
        "images_per_s": gpu.get("images_per_s"),
        "synthetic_images_per_s": synthetic.get("images_per_s"),
        "synthetic_processes": synthetic_processes,
        "decode_images_per_s": decode_rate,
    }
    if launcher:
        row["launcher"] = launcher
    if flags:
        row["xla_flags"] = flags
    if "started" in gpu:  # the processes jia_jax.main started (1: it trained alone)
        row["started"] = gpu["started"]
    if gpu.get("input_wait") is not None:  # runs logged since the trainer measures it
        row["input_wait"] = gpu["input_wait"]
    if "input_stages_ms" in gpu:  # runs logged since the trainer says where its input waits
        row["input_stages_ms"] = gpu["input_stages_ms"]
    # Each run's host side where it was recorded: its ms a step in the step's call (near the
    # step's own time, the host paces the GPU), where its CPU went (train_input --thread_cpu),
    # XLA's updates of its command buffers (train_input --command_buffer_log) and its garbage
    # collector's passes (train_input --gc_log).
    for field in ("launch_ms", "thread_cpu", "command_buffer_updates", "gc_pauses"):
        for prefix, run in (("", gpu), ("synthetic_", synthetic)):
            if field in run:
                row[prefix + field] = run[field]
    if row["images_per_s"] and row["synthetic_images_per_s"]:
        row["ratio"] = row["images_per_s"] / row["synthetic_images_per_s"]
    failed = [r.get("error", "no run") for r in (synthetic, gpu) if not r or "error" in r]
    if failed:
        row["errors"] = failed
    return row


def _parser() -> argparse.ArgumentParser:
    """The command line: a mode and each mode's options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "mode",
        choices=("smoke", "decode", "loaded", "contention", "crop", "records", "report",
                 "decode_loop"),
    )
    parser.add_argument("--data_dir", default="/tmp/jia_bench_data")
    parser.add_argument("--num_images", type=int, default=1024, help="JPEGs to write if absent")
    parser.add_argument("--image_size", type=int, default=224)
    parser.add_argument("--canvas", type=int, default=512, help="data.gpu_canvas")
    parser.add_argument("--num_workers", type=int, default=0,
                        help="smoke, records: data.num_workers")
    parser.add_argument("--record_seconds", type=float, default=10.0,
                        help="records: seconds of reading timed, the rate over their second half")
    parser.add_argument("--images", type=int, default=256, help="smoke: eval images")
    parser.add_argument("--batch", type=int, default=64, help="smoke: eval batch")
    parser.add_argument("--per_gpu", type=int, nargs="+", default=[256, 64], help="decode")
    parser.add_argument("--batches", type=int, default=4, help="decode: record batches held")
    parser.add_argument("--crop_kernels", nargs="+", default=[DEFAULT_CROP_KERNEL],
                        choices=CROP_KERNELS, help="crop: the resize's products")
    parser.add_argument("--repeats", type=int, default=5, help="decode: passes over them")
    parser.add_argument(
        "--depth", type=int, nargs="+", default=[1],
        help="decode, loaded: decoders per GPU taking the batches in turn (data.gpu_decode_depth)",
    )
    parser.add_argument(
        "--sample_formats", nargs="+", default=["I_RGB"],
        help="decode: nvimgcodec.SampleFormat names of the whole-image decode (e.g. I_RGB I_RGBA)",
    )
    parser.add_argument("--stage", help="report: the decode stage's JSON")
    parser.add_argument("--runs", nargs="*", default=[], help="report: train_input JSONs")
    parser.add_argument(
        "--decoder_options",
        nargs="+",
        default=["", _PREALLOCATED],
        help="loaded: nvImageCodec decoder options to compare ('' = the trainer's)",
    )
    parser.add_argument(
        "--tiny_model", action="store_true", help="loaded: the model trains tiny (CPU tests)"
    )
    parser.add_argument(
        "--train_model", default="resnet50",
        help="loaded: the model that trains (alexnet_bn compiles faster on CPU)",
    )
    parser.add_argument(
        "--train_compute_dtype", default="bfloat16", help="loaded: its precision.compute"
    )
    parser.add_argument("--loads", nargs="+", default=["records", "decode", "both"],
                        choices=LOADS,
                        help="contention: what runs beside the step, each after it alone")
    parser.add_argument("--other_rate", type=float, default=0.0,
                        help="contention, other: images/s the other process decodes at most")
    parser.add_argument("--rounds", type=int, default=2, help="contention: rounds of the loads")
    parser.add_argument("--load_seconds", type=float, default=8.0,
                        help="contention: seconds of each row")
    parser.add_argument("--trace_seconds", type=float, default=0.0,
                        help="contention: seconds of each row traced first (0: none)")
    parser.add_argument("--contention_options", nargs="+", default=[""],
                        help="contention: the decoders' options, a decode (and both) row each")
    parser.add_argument("--out", help="required but in decode_loop")
    return parser


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = _parser()
    args = parser.parse_args(argv)
    if not args.out and args.mode != "decode_loop":
        parser.error("--out is required")
    if "other" in args.loads and {"decode", "both"} & set(args.loads):
        parser.error("--loads: other runs without decode and both (a decoder in this process "
                     "makes the step's kernels follow one another later for the rest of it)")
    if args.mode == "report":
        doc = report(args)
        harness.write_json(args.out, doc)
        return doc
    from absl import flags  # pylint: disable=import-outside-toplevel

    from scripts.bench import input as bench_input  # pylint: disable=import-outside-toplevel

    flags.FLAGS.mark_as_parsed()  # grain's worker processes read an absl flag
    if args.mode == "decode_loop":  # the dataset is the parent's
        decode_loop(args, sys.stdin, sys.stdout)
        return {}
    bench_input.prepare(args.data_dir, args.num_images, "array_record")  # unless there
    modes = {"smoke": smoke, "decode": decode_stage, "loaded": loaded, "contention": contention,
             "crop": crop, "records": records}
    doc = modes[args.mode](args)
    doc = {"command": " ".join(sys.argv), "args": vars(args), **doc}
    harness.close_record(args.out, doc)
    print(json.dumps({k: v for k, v in doc.items() if k not in ("odd_images", "args")}, indent=1))
    return doc


if __name__ == "__main__":
    from jia_jax import gpu_decode as _gpu_decode  # pylint: disable=import-outside-toplevel

    from jia_jax import nvimgcodec_quiet  # pylint: disable=import-outside-toplevel

    # As jia_jax.main does before JAX starts CUDA: the trainer's hardware queues and nvImageCodec
    # imported quietly, unless set.
    os.environ.update(_gpu_decode.cuda_environment("gpu", os.environ))
    os.environ.update(nvimgcodec_quiet.environment("gpu", os.environ))
    main()
