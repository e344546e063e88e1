"""The GPU decoder's tile arrays, reused: a few per shape on each device, each handed out again
once the XLA program that last read it has finished.

The decoder writes into an array behind XLA's back, so it must not write while an XLA program
writes or reads the array (jia_jax/gpu_decode.py). A fresh array per batch would make the host
wait for its zeros, which XLA writes on its compute stream behind the train steps already
dispatched: decoding the next batch would wait for the last dispatched step, never overlapping
one. A ring makes each array once, when first needed, and afterwards waits only for the program
that last read the array, the crop and resize of a batch decoded a few batches before
(jia_jax/gpu_input.py), which ran before that batch's train step: normally it has long
finished.

What an earlier batch left in an array is never read: the crop reads a tile only within the
region the decoder wrote (jia_jax/crop_resize.py gives weight 0 from the image's extent measured
from the tile's origin, and the region is that extent clipped to the canvas), padding tiles
have weight 0 and belong to no example, and an example one of whose tiles did not decode is
replaced by the CPU path's.

Per shape the ring makes a new array only when none it holds has finished being read, and at
most `DEPTH`; with `DEPTH` arrays out, `take` waits for one to come back.
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Protocol

import jax

from jia_jax import gpu_decode

# Arrays per shape (`data.gpu_tile_ring_depth` sets it for the trainer). A wait in `take` is for
# the crop of the batch `DEPTH` back, which the device runs before that batch's train step; the
# batches after it are decoded by then, so the wait keeps the decoder at most `DEPTH` batches
# ahead of the device and does not make the device wait. The input thread itself runs up to 2
# batches ahead of the trainer (gpu_input._AHEAD) with 2 more under way per decoder (_UNDER_WAY),
# the trainer keeps up to loop.METRICS_LAG + 1 steps in flight, and the train and eval streams
# share a ring. Yet on one H200 host, training at 256 images a batch, the loop waited for input
# 46% of the time with 4 and 22% with 8, which trained 1.055x faster (docs/input_pipeline.md,
# "How fast it is"); each array more is 201 MB of XLA's pool at 256 ImageNet crops per GPU.
DEPTH = 8


class Reader(Protocol):
    """What the ring waits for: the output of the last XLA program that read an array."""

    def is_deleted(self) -> bool: ...

    def is_ready(self) -> bool: ...

    def block_until_ready(self) -> Any: ...


class TileRing:
    """uint8 [count, canvas, canvas, 3] tile arrays on one device, each held by one taker at a
    time and handed out only after its last reader finished. Thread-safe."""

    def __init__(self, device: jax.Device, depth: int = DEPTH) -> None:
        self._device, self._depth = device, depth
        self._given = threading.Condition()
        # Per (count, canvas): the arrays given back, oldest first, with their last reader.
        self._free: dict[tuple[int, int], list[tuple[jax.Array, Reader | None]]] = (
            collections.defaultdict(list)
        )
        self._made: collections.Counter[tuple[int, int]] = collections.Counter()

    def take(self, count: int, canvas: int) -> jax.Array:
        """A [count, canvas, canvas, 3] array that no XLA program reads or writes until it is
        given back; its pixels are whatever an earlier taker left."""
        tiles, reader = self._claim((count, canvas))
        if tiles is None:
            return gpu_decode.new_tiles(self._device, count, canvas)
        if reader is not None:
            reader.block_until_ready()
        return tiles

    def give(self, tiles: jax.Array, reader: Reader | None) -> None:
        """Gives back `tiles`, taken from this ring, with the output of the last XLA program
        that reads it (None if none does). Nothing may donate `reader`."""
        with self._given:
            self._free[tiles.shape[:2]].append((tiles, reader))
            self._given.notify_all()

    def _claim(self, shape: tuple[int, int]) -> tuple[jax.Array | None, Reader | None]:
        """A given-back array whose reader finished; else (None, None), to make one, if fewer
        than `depth` exist; else the oldest given back and its reader, to wait for outside the
        lock; else, once one is given back, that."""
        with self._given:
            while True:
                free = self._free[shape]
                for i, (tiles, reader) in enumerate(free):
                    if _finished(reader):
                        del free[i]
                        return tiles, None
                if self._made[shape] < self._depth:
                    self._made[shape] += 1
                    return None, None
                if free:
                    return free.pop(0)
                self._given.wait()


def _finished(reader: Reader | None) -> bool:
    if reader is None:
        return True
    if reader.is_deleted():  # its program may still be reading (and `is_ready` would crash)
        raise RuntimeError(
            "A tile array's reader was deleted or donated: the ring cannot tell when the array "
            "was last read."
        )
    return reader.is_ready()
