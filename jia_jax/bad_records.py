"""Damaged records of a tfds ArrayRecord dataset: named, replaced the same way every time, counted.

Two kinds of damage:
  * A shard cut short or with a broken footer: `check_shards` stops before any batch, naming the
    file (a reader then finds 0 records where the dataset's metadata lists N).
  * A single bad record (bad JPEG bytes, a chunk whose checksum fails, an empty record): the
    train stream replaces it by the next readable record of the process's part (cyclically)
    with the slot's own random crop, so the stream stays a pure function of (seed, step) and a
    resumed run sees the same batches; an eval pass leaves it out (mask 0). Each example says
    how many records it skipped, and `BadRecordCounter`, on the consuming side (after any worker
    processes), logs every distinct bad record with its file, position and error, and raises
    `CorruptDatasetError` once there are more than `data.max_bad_records` (default 0: the first
    one stops the run). The count starts again at a resume.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import numpy as np
from absl import logging

from jia_jax import console

T = TypeVar("T")

# Keys each example carries for the counter; `BadRecordCounter` removes them from the batch.
SKIPPED = "skipped_records"
SKIPPED_FROM = "skipped_from"

_HINT = (
    "Re-prepare the dataset (tfds build ... --file_format=array_record) or restore the file; "
    "--config.data.max_bad_records=N replaces up to N unreadable records instead (the same "
    "way every time) and logs each."
)


class CorruptDatasetError(RuntimeError):
    """A shard or record of the dataset cannot be read."""


def check_shards(file_instructions: Sequence[Any]) -> None:
    """Raises `CorruptDatasetError` naming a shard that lacks records or cannot be opened.

    Args:
      file_instructions: tfds `FileInstruction`s (filename, examples_in_shard) of the split.
    """
    from array_record.python import array_record_module  # the reader tfds data sources use

    for filename, expected in sorted(
        {(f.filename, f.examples_in_shard) for f in file_instructions}
    ):
        try:
            # Opened as the data source opens it (array_record_data_source._create_reader).
            reader = array_record_module.ArrayRecordReader(
                filename, options="readahead_buffer_size:0"
            )
        except RuntimeError as e:
            raise CorruptDatasetError(f"Cannot open {filename} ({e}).\n{_HINT}") from e
        # A reader that cannot find the file's index (its footer) is not ok and lists 0 records.
        found = reader.num_records() if reader.ok() else 0
        if found != expected:
            raise CorruptDatasetError(
                f"{filename} holds {found} readable records where the dataset's metadata lists "
                f"{expected}: the file is truncated or damaged.\n{_HINT}"
            )
        reader.close()


class RecordLocator:
    """Maps an index of a split (or part of one) to (file, record position in that file)."""

    def __init__(self, file_instructions: Sequence[Any]) -> None:
        self._files = [(f.filename, f.skip) for f in file_instructions]
        self._ends = list(np.cumsum([f.take for f in file_instructions]))

    def __call__(self, index: int) -> tuple[str, int]:
        shard = bisect.bisect_right(self._ends, index)
        start = self._ends[shard - 1] if shard else 0
        filename, skip = self._files[shard]
        return filename, skip + index - start


def first_readable(read: Callable[[int], T], index: int, size: int) -> tuple[int, T]:
    """`(skipped, read(i))` for the first i from `index` on, cyclically, that reads.

    Raises:
      CorruptDatasetError: no record of the `size` can be read.
    """
    for skipped in range(size):
        # Any failure makes the record bad (ArrayRecord, protobuf and PIL raise different types);
        # the counter names it.
        try:
            return skipped, read((index + skipped) % size)
        except Exception:  # noqa: BLE001, S112
            continue
    raise CorruptDatasetError(f"None of the {size} records can be read ({failure(read, index)}).")


def failure(read: Callable[[int], Any], index: int) -> str:
    """The error that reading record `index` raises, as text."""
    try:
        read(index)
    except Exception as e:  # noqa: BLE001  whatever it is, it is the reason
        return console.error_text(e)
    return "read fine on a second try: a transient error"


class BadRecordCounter:
    """Consumer side: logs each distinct bad record the batches report; raises past `limit`.

    Args:
      read: Reads record i of the process's part; raises on a bad record.
      size: Records in the process's part.
      locate: Maps i to (file, position), for the messages.
      limit: How many distinct bad records to accept (`data.max_bad_records`).
    """

    def __init__(
        self,
        read: Callable[[int], Any],
        size: int,
        locate: Callable[[int], tuple[str, int]],
        limit: int,
    ) -> None:
        self._read, self._size, self._locate, self._limit = read, size, locate, limit
        self._seen: set[int] = set()

    def __call__(self, batches: Iterator[dict[str, np.ndarray]]) -> Iterator[dict[str, np.ndarray]]:
        """Yields `batches` without the counter's keys, after checking them."""
        for batch in batches:
            skipped, start = batch.pop(SKIPPED), batch.pop(SKIPPED_FROM)
            for count, first in zip(skipped.tolist(), start.tolist(), strict=True):
                for offset in range(count):
                    self._found((first + offset) % self._size)
            yield batch

    def _found(self, index: int) -> None:
        if index in self._seen:
            return
        self._seen.add(index)
        filename, position = self._locate(index)
        what = f"record {position} of {filename} ({failure(self._read, index)})"
        if len(self._seen) > self._limit:
            raise CorruptDatasetError(
                f"Cannot read {what}: {len(self._seen)} unreadable records, more than "
                f"data.max_bad_records={self._limit}.\n{_HINT}"
            )
        logging.warning(
            "Skipped unreadable %s: %d of at most %d.", what, len(self._seen), self._limit
        )
