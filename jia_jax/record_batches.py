"""The host half of the GPU input path: encoded records and their crop windows, in batches.

Each example is read from the ArrayRecord files as the CPU path reads it (jia_jax/tfds_input.py:
the same positions, records and per-example random numbers) but left encoded: only the image's
header is parsed, for its size (jia_jax/image_header.py), and the crop window and flip are drawn
from the size (jia_jax/crop_windows.py). So batch k holds the records, windows and flips of the
CPU path's batch k. A record whose bytes hold no image header is replaced by the next readable
one, as the CPU path replaces it; one whose header reads but whose pixels do not decode is caught
by the device half, which then takes the CPU path's example for that slot (jia_jax/gpu_input.py).

A batch is a dict of numpy arrays, so that grain's worker processes hand it over in shared
memory: the images' bytes concatenated (`encoded`, with `offsets` [B + 1]), `size` (width,
height) [B, 2], `box` (left, top, right, bottom) [B, 4], `flip` [B], `label` [B], the bad-record
counts of jia_jax/bad_records.py, and for eval `mask` [B] (an example without image bytes, the
padding or a record left out, has mask 0).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import grain
import numpy as np

from jia_jax import bad_records, crop_windows, image_header, tfds_input

ENCODED, OFFSETS, SIZE, BOX, FLIP = "encoded", "offsets", "size", "box", "flip"
# What only the device half reads; the rest of a batch goes on to the trainer.
RECORD_KEYS = (ENCODED, OFFSETS, SIZE, BOX, FLIP)


def read_header(
    source: Sequence[dict[str, Any]], index: int
) -> tuple[np.ndarray, np.int32, tuple[int, int]]:
    """Record `index` as (encoded bytes, label, (width, height)); raises if its bytes hold no
    image header (`image_header.image_size`)."""
    encoded, label = tfds_input.read_record(source, index)
    return np.frombuffer(encoded, np.uint8), label, image_header.image_size(encoded)


def train_record(
    index: int, rng: np.random.Generator, *, source: Sequence[dict[str, Any]]
) -> dict[str, np.ndarray]:
    """Record `index` (or the next readable one) with its random crop window and flip."""
    skipped, (encoded, label, size) = bad_records.first_readable(
        functools.partial(read_header, source), index, len(source)
    )
    box, flip = crop_windows.train_window(rng, *size)
    return {
        ENCODED: encoded,
        SIZE: np.asarray(size, np.int32),
        BOX: np.asarray(box, np.float64),
        FLIP: np.bool_(flip),
        "label": label,
        bad_records.SKIPPED: np.int32(skipped),
        bad_records.SKIPPED_FROM: np.int64(index),
    }


def eval_record(index: int, *, source: Sequence[dict[str, Any]]) -> dict[str, np.ndarray]:
    """Record `index` with its centre crop; mask 0 past the part's end or where it is damaged."""

    def window(record: tuple[np.ndarray, np.int32, tuple[int, int]]) -> dict[str, np.ndarray]:
        encoded, label, size = record
        box = crop_windows.eval_crop_box(*size)
        size_and_box = {SIZE: np.asarray(size, np.int32), BOX: np.asarray(box, np.float64)}
        return {ENCODED: encoded, **size_and_box, "label": label}

    blank = {
        ENCODED: np.zeros(0, np.uint8),
        SIZE: np.zeros(2, np.int32),
        BOX: np.zeros(4, np.float64),
        FLIP: np.bool_(False),
    }
    return tfds_input.eval_entry(index, source, blank, read_header, window)


def pack(records: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """One batch of records: bytes concatenated with their offsets, every other field stacked."""
    lengths = [len(r[ENCODED]) for r in records]
    batch = {key: np.stack([r[key] for r in records]) for key in records[0] if key != ENCODED}
    batch[ENCODED] = np.concatenate([r[ENCODED] for r in records])
    batch[OFFSETS] = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return batch


def train_batches(
    part: tfds_input.ProcessPart,
    *,
    local_batch: int,
    seed: int,
    start_step: int,
    process_index: int,
) -> grain.MapDataset:
    """Batch k (from `start_step`) of the CPU path's train stream, as records and windows."""
    records = tfds_input.train_examples(
        part, seed, process_index, functools.partial(train_record, source=part.source)
    )
    return records.batch(local_batch, drop_remainder=True, batch_fn=pack)[start_step:]


def eval_batches(
    part: tfds_input.ProcessPart, *, local_batch: int, num_batches: int
) -> grain.MapDataset:
    """The eval pass of the CPU path, as records and windows."""
    return (
        grain.MapDataset.range(num_batches * local_batch)
        .map(functools.partial(eval_record, source=part.source))
        .batch(local_batch, batch_fn=pack)
    )
