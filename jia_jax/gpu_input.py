"""The GPU input path: records read on the host, decoded, cropped and resized on each device.

Per batch, the host reads the CPU path's records and crop windows (jia_jax/record_batches.py, in
grain's worker processes when `data.num_workers` > 0). Then each local device takes its rows of
the batch, the rows the batch sharding gives it: the decoder writes their tiles into an array
in the device's memory (jia_jax/gpu_decode.py), taken from the device's ring of tile arrays
(jia_jax/tile_ring.py), and one jitted program crops, resizes and flips them into uint8
[rows, S, S, 3] there (jia_jax/crop_resize.py). The array goes back to the ring, to be reused
once that program has finished, so a batch does not wait for a fresh array's zeros, which XLA
writes behind the train steps already queued. The train and eval steps normalise the images,
as they do the CPU path's. The per-device images become the global batch with
`jax.make_array_from_single_device_arrays`: no pixel crosses the host. A thread runs this two
batches ahead of the trainer, with two threads per decoder for the decoding, each with a batch
under way: one prepares its batch on the host (the tile plan, each JPEG's header parsed) while
the decoder decodes the other's; with `data.gpu_decode_depth` > 1 each device has that many
decoders (each its own CUDA stream and tile ring), which take the batches in turn, so the next
batches decode while a batch's crops run.

An example the decoder refuses (a CMYK or PNG record, bytes that do not decode) is the CPU path's
example for that slot, decoded and resized with Pillow on the host and uploaded: the same
record, window and flip, or, where the record is damaged, the same replacement (train) or mask 0
(eval). The bad-record counter then names damaged records as the CPU path does.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import itertools
import math
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import grain
import jax
import ml_collections
import numpy as np
from absl import logging

from jia_jax import (
    crop_kernel,
    crop_resize,
    gpu_decode,
    record_batches,
    stage_clock,
    tfds_input,
    tile_ring,
)

T = TypeVar("T")
Batch = dict[str, jax.Array]
# A position of the process's example stream -> the CPU path's example there.
Fallback = Callable[[int], dict[str, np.ndarray]]
_AHEAD = 2
# Batches under way per decoder: its host work for one (the plan, each JPEG's header parsed, the
# slots described) overlaps its decoding of the other. On an H200 host whose input fell behind at
# 256 images, one batch at a time took 33.7 ms of the step's 34.5 beside it, nvImageCodec's call
# 22.1 of them (docs/input_pipeline.md).
_UNDER_WAY = 2


@dataclasses.dataclass(frozen=True)
class DeviceDecoder:
    """One local device, its decoder and the tile arrays it decodes into."""

    device: jax.Device
    decode: gpu_decode.TileDecoder
    ring: tile_ring.TileRing


def device_rows(
    sharding: jax.sharding.Sharding, global_batch: int
) -> list[tuple[jax.Device, slice]]:
    """Each local device and the rows of this process's batch it holds under `sharding`.

    Raises:
      ValueError: the process's devices do not hold one contiguous block of rows each.
    """
    spans = sorted(
        (index[0].indices(global_batch)[:2], device.id, device)
        for device, index in sharding.addressable_devices_indices_map((global_batch,)).items()
    )
    offset = stop = spans[0][0][0]
    for (start, end), _, _ in spans:
        if start != stop:
            raise ValueError(f"The batch sharding gives this process rows {spans}: not one block.")
        stop = end
    return [(device, slice(start - offset, end - offset)) for (start, end), _, device in spans]


def device_decoders(
    devices: Sequence[jax.Device],
    fancy_upsampling: bool = True,
    ring_depth: int = tile_ring.DEPTH,
    options: str = "",
) -> dict[jax.Device, DeviceDecoder]:
    """A decoder (`gpu_decode.new_decoder`, with nvImageCodec's `options`) and a tile ring of
    `ring_depth` per device."""
    return {
        d: DeviceDecoder(
            d,
            gpu_decode.new_decoder(d, options=options, fancy_upsampling=fancy_upsampling),
            tile_ring.TileRing(d, ring_depth),
        )
        for d in devices
    }


def decode_rows(
    batch: dict[str, np.ndarray],
    rows: slice,
    decoder: DeviceDecoder,
    image_size: int,
    canvas: int,
    crop_kernel: str = crop_resize.DEFAULT_KERNEL,
) -> tuple[jax.Array, list[int]]:
    """`rows` of a record batch as uint8 [rows, S, S, 3] on the decoder's device, and the rows
    (counted from the first of `rows`) that did not decode. `crop_kernel` (`data.gpu_crop_kernel`)
    takes the crop's products on a GPU; elsewhere (tests' CPU devices) XLA's are taken."""
    first, stop = rows.start, rows.stop
    offsets = batch[record_batches.OFFSETS]
    plan = crop_resize.plan_tiles(
        batch[record_batches.BOX][rows],
        batch[record_batches.SIZE][rows],
        batch[record_batches.FLIP][rows],
        offsets[first + 1 : stop + 1] > offsets[rows],
        image_size,
        canvas,
    )
    encoded = batch[record_batches.ENCODED]
    wanted = [encoded[offsets[first + e] : offsets[first + e + 1]] for e in plan.example.tolist()]
    count = crop_resize.padded_count(len(wanted), stop - first)
    tiles = decoder.ring.take(count, canvas)
    reader = None  # an output of the program that reads `tiles`, once enqueued
    try:
        decoded = decoder.decode(wanted, plan.region, tiles)
        failed = sorted(set(plan.example[~decoded].tolist()))
        # A tile that did not decode is read like any other; its example's row is replaced after.
        plan = crop_resize.pad_plan(plan, count, stop - first)
        images, reader = _crop_with_reader(
            tiles,
            jax.device_put(plan.example, decoder.device),
            jax.device_put(plan.params, decoder.device),
            batch=stop - first,
            image_size=image_size,
            one_tile_each=crop_resize.is_one_tile_each(plan, stop - first),
            kernel=crop_kernel if decoder.device.platform == "gpu" else "xla",
        )
    finally:
        decoder.ring.give(tiles, reader)
    return images, failed


@functools.partial(jax.jit, static_argnames=("batch", "image_size", "one_tile_each", "kernel"))
def _crop_with_reader(
    tiles: jax.Array,
    example: jax.Array,
    params: jax.Array,
    *,
    batch: int,
    image_size: int,
    one_tile_each: bool,
    kernel: str,
) -> tuple[jax.Array, jax.Array]:
    """`crop_resize.crop_resize`'s images and one of their pixels, for the tile ring to wait on.
    Given the images themselves, the ring would keep each batch's alive until it hands their
    tiles out again, several batches later: memory that the train steps' temporary buffers must
    be placed around in XLA's pool (docs/input_pipeline.md)."""
    images = crop_resize.crop_resize(
        tiles, example, params, batch=batch, image_size=image_size,
        one_tile_each=one_tile_each, kernel=kernel,
    )
    return images, images[:1, :1, :1, :1]


@jax.jit
def _put_row(images: jax.Array, row: jax.Array, pixels: jax.Array) -> jax.Array:
    return jax.lax.dynamic_update_index_in_dim(images, pixels, row, 0)


class _FallbackLog:
    """Logs how many examples the decoders refused, at 1, 10, 100, ... of them."""

    def __init__(self) -> None:
        self.count = 0

    def add(self, count: int) -> None:
        if not count:
            return
        before, self.count = self.count, self.count + count
        if before == 0 or int(math.log10(self.count)) > int(math.log10(before)):
            logging.warning(
                "%d examples so far decoded with Pillow on the CPU: the GPU decoder refused them "
                "(CMYK, PNG or damaged records).",
                self.count,
            )


def device_batches(
    batches: Iterator[dict[str, np.ndarray]],
    decoder_sets: Sequence[Sequence[tuple[DeviceDecoder, slice]]],
    fallback: Fallback,
    *,
    first_step: int,
    image_size: int,
    canvas: int,
    crop_kernel: str = crop_resize.DEFAULT_KERNEL,
    clock: stage_clock.StageClock | None = None,
) -> Iterator[dict[str, Any]]:
    """Record batches decoded on the devices: {"image": per-device arrays in the decoder sets'
    order, then the batch's host fields (label, mask, bad-record counts)}.

    Batch k is decoded by set k mod len(`decoder_sets`) (each set: a decoder and its rows per
    device), so with several sets the next batches decode while a batch's crops run; each set has
    up to `_UNDER_WAY` batches under way; batches come out in order. `clock`, if given, counts
    per batch the seconds this thread waited for the record batch (`read`) and for its decoding
    (`decode`)."""
    log = _FallbackLog()
    pending: collections.deque = collections.deque()
    under_way = _UNDER_WAY * len(decoder_sets)
    workers = _UNDER_WAY * sum(len(decoders) for decoders in decoder_sets)
    records = iter(batches)
    own_threads: set[int] = set()
    pool = concurrent.futures.ThreadPoolExecutor(
        workers, "decode", initializer=lambda: own_threads.add(threading.get_ident())
    )
    try:
        for step in itertools.count(first_step):
            start = time.perf_counter()
            batch = next(records, None)
            if batch is None:
                break
            read = time.perf_counter() - start
            decoders = decoder_sets[(step - first_step) % len(decoder_sets)]
            futures = [
                pool.submit(decode_rows, batch, rows, d, image_size, canvas, crop_kernel)
                for d, rows in decoders
            ]
            pending.append((step, batch, decoders, futures, read))
            if len(pending) == under_way:
                yield _collected(*pending.popleft(), fallback, log, clock)
        while pending:
            yield _collected(*pending.popleft(), fallback, log, clock)
    finally:
        # A generator left unfinished is closed by garbage collection on whichever thread runs
        # it, one of this pool's included, and a thread cannot wait for itself to end.
        pool.shutdown(wait=threading.get_ident() not in own_threads, cancel_futures=True)


def _collected(
    step: int,
    batch: dict[str, np.ndarray],
    decoders: Sequence[tuple[DeviceDecoder, slice]],
    futures: Sequence[concurrent.futures.Future],
    read: float,
    fallback: Fallback,
    log: _FallbackLog,
    clock: stage_clock.StageClock | None,
) -> dict[str, Any]:
    """One batch of `device_batches` once its decodes are done: refused rows replaced."""
    start = time.perf_counter()
    concurrent.futures.wait(futures)
    if clock is not None:
        clock.add_batch({"read": read, "decode": time.perf_counter() - start})
    first_position = step * len(batch["label"])
    # Copied: arrays from grain's workers may be read-only shared memory.
    host = {k: np.array(v) for k, v in batch.items() if k not in record_batches.RECORD_KEYS}
    images = []
    for (_, rows), future in zip(decoders, futures, strict=True):
        pixels, failed = future.result()
        for row in failed:
            example = fallback(first_position + rows.start + row)
            pixels = _put_row(pixels, row, example.pop("image"))
            for key, value in example.items():
                host[key][rows.start + row] = value
        log.add(len(failed))
        images.append(pixels)
    return {"image": images, **host}


def assemble(batch: dict[str, Any], sharding: jax.sharding.Sharding, global_batch: int) -> Batch:
    """The global batch: the per-device images as one array, the host fields uploaded."""
    shards = batch.pop("image")
    shape = (global_batch, *shards[0].shape[1:])
    images = jax.make_array_from_single_device_arrays(shape, sharding, shards)
    fields = {k: jax.make_array_from_process_local_data(sharding, v) for k, v in batch.items()}
    return {"image": images, **fields}


def background(items: Iterator[T], depth: int = _AHEAD) -> Iterator[T]:
    """`items`, produced by a thread that runs up to `depth` ahead; its error is raised here."""
    slots: queue.Queue = queue.Queue(depth)
    stop = threading.Event()

    def put(entry: tuple[bool, Any]) -> bool:
        while not stop.is_set():
            try:
                slots.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not put((True, item)):
                    return
        except BaseException as error:  # pylint: disable=broad-except  # raised by the consumer
            put((False, error))
            return
        put((False, None))

    thread = threading.Thread(target=produce, name="gpu-input", daemon=True)
    thread.start()
    try:
        while True:
            ok, item = slots.get()
            if ok:
                yield item
            elif item is None:
                return
            else:
                raise item
    finally:
        stop.set()
        thread.join()


def check_crop_kernel(data: ml_collections.ConfigDict, platforms: set[str]) -> None:
    """Raises if `data.gpu_crop_kernel` is unknown, or is 'pallas' with a canvas or image size
    its kernels cannot take on the GPUs among `platforms` (elsewhere XLA's products crop, as
    `decode_rows` takes them off GPUs)."""
    kernel = data.get("gpu_crop_kernel", crop_resize.DEFAULT_KERNEL)
    if kernel not in crop_resize.KERNELS:
        raise ValueError(
            f"data.gpu_crop_kernel={kernel!r} must be one of {crop_resize.KERNELS}.")
    needs = crop_kernel.unsupported(data.gpu_canvas, data.image_size)
    if kernel == "pallas" and needs and "gpu" in platforms:
        raise ValueError(f"data.gpu_crop_kernel='pallas' needs {needs}; or set it to 'xla'.")


@dataclasses.dataclass(frozen=True)
class GpuStreams:
    """The train and eval streams of a tfds dataset on the GPU path."""

    data: ml_collections.ConfigDict
    sharding: jax.sharding.Sharding
    global_batch: int
    eval_batch: int
    seed: int
    decoders: tuple[dict[jax.Device, DeviceDecoder], ...]  # `data.gpu_decode_depth` sets
    # The train stream's input thread: its waits per batch, for the progress line.
    clock: stage_clock.StageClock = dataclasses.field(default_factory=stage_clock.StageClock)

    @classmethod
    def create(
        cls,
        data: ml_collections.ConfigDict,
        sharding: jax.sharding.Sharding,
        global_batch: int,
        eval_batch: int,
        seed: int,
    ) -> GpuStreams:
        """Builds `data.gpu_decode_depth` decoders per local device up front, so a broken one
        stops the run at once."""
        if data.gpu_canvas < 16:
            raise ValueError(f"data.gpu_canvas={data.gpu_canvas} must be at least 16.")
        depth = data.get("gpu_decode_depth", 1)
        if depth < 1:
            raise ValueError(f"data.gpu_decode_depth={depth} must be at least 1.")
        ring = data.get("gpu_tile_ring_depth", tile_ring.DEPTH)
        if ring < 1:
            raise ValueError(f"data.gpu_tile_ring_depth={ring} must be at least 1.")
        devices = sorted(sharding.addressable_devices, key=lambda d: d.id)
        check_crop_kernel(data, {d.platform for d in devices})
        if len(devices) > 1:
            # Measured: one process's decode stage did not scale past one GPU.
            logging.warning(
                "Decoding on %d GPUs from one process: one process per GPU keeps up far better "
                "(docs/input_pipeline.md). python -m jia_jax.main trains so by itself on one "
                "machine where distributed.process_per_gpu is 'auto' or 'always' and the mesh is "
                "left to infer; under SLURM, start one task per GPU.",
                len(devices),
            )
        fancy = bool(data.gpu_fancy_upsampling)
        options = data.get("gpu_decoder_options", "")
        decoders = tuple(device_decoders(devices, fancy, ring, options) for _ in range(depth))
        return cls(data, sharding, global_batch, eval_batch, seed, decoders)

    def train(self, start_step: int) -> Iterator[Batch]:
        """Global train batches from `start_step`: the CPU path's stream, decoded here."""
        data, process, processes = self.data, jax.process_index(), jax.process_count()
        local_batch = self.global_batch // processes
        part = tfds_input.process_part(
            data.name, data.data_dir, data.train_split, process, processes, drop_remainder=True
        )
        tfds_input.check_train_part(part, local_batch, data.train_split, process)
        records = record_batches.train_batches(
            part,
            local_batch=local_batch,
            seed=self.seed,
            start_step=start_step,
            process_index=process,
        )
        augment = functools.partial(
            tfds_input.train_example, source=part.source, image_size=data.image_size
        )
        cpu_examples = tfds_input.train_examples(part, self.seed, process, augment)
        return self._stream(
            records, part, cpu_examples.__getitem__, start_step, self.global_batch, self.clock
        )

    def eval(self) -> Iterator[Batch]:
        """One pass over the eval split, padded with mask 0, as the CPU path's."""
        data, process, processes = self.data, jax.process_index(), jax.process_count()
        local_batch = self.eval_batch // processes
        part = tfds_input.process_part(
            data.name, data.data_dir, data.eval_split, process, processes, drop_remainder=False
        )
        num_batches = tfds_input.eval_batch_count(
            data.name, data.data_dir, data.eval_split, processes, local_batch
        )
        records = record_batches.eval_batches(
            part, local_batch=local_batch, num_batches=num_batches
        )
        fallback = functools.partial(
            tfds_input.eval_example, source=part.source, image_size=data.image_size
        )
        return self._stream(records, part, fallback, 0, self.eval_batch)

    def _stream(
        self,
        records: grain.MapDataset,
        part: tfds_input.ProcessPart,
        fallback: Fallback,
        first_step: int,
        global_batch: int,
        clock: stage_clock.StageClock | None = None,
    ) -> Iterator[Batch]:
        data = self.data
        placement = device_rows(self.sharding, global_batch)
        decoder_sets = [[(s[device], rows) for device, rows in placement] for s in self.decoders]
        host = tfds_input.host_iterator(records, num_threads=4, num_workers=data.num_workers)
        decoded = device_batches(
            host,
            decoder_sets,
            fallback,
            first_step=first_step,
            image_size=data.image_size,
            canvas=data.gpu_canvas,
            crop_kernel=data.get("gpu_crop_kernel", crop_resize.DEFAULT_KERNEL),
            clock=clock,
        )
        counted = tfds_input.bad_record_counter(part, data.max_bad_records)(decoded)
        return background(assemble(b, self.sharding, global_batch) for b in counted)
