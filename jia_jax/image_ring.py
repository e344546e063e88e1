"""The GPU path's batch images, reused: each batch's crop program writes into the memory of an
earlier batch's images instead of taking new memory from XLA's pool.

Why: before launching the train step's command buffer (a CUDA graph), XLA records again each
command that uses a buffer whose address moved since the last launch (openxla/xla,
`CommandBufferThunk`). With synthetic data the step's temporary buffers land at one address
every step; on the GPU path, whose crop program takes a new [rows, S, S, 3] array from XLA's
pool between steps, XLA's own log showed about three times the commands recorded again a step,
the extra being those that use the temporaries (docs/input_pipeline.md). An array donated to
the crop program (`jax.jit`'s `donate_argnames`) is its output, so in steady state the pool sees
no allocation of a batch's size between steps.

An array is handed out again only once the global batch built from it (its owner) has been
garbage collected: the trainer holds a batch until it has dispatched that step and fetched the
next batch, and a program donated an array is ordered after the steps dispatched before it on
the device's stream, so it never writes pixels a dispatched step has yet to read.
"""

from __future__ import annotations

import collections
import threading
import weakref
from typing import Any

import jax

# Arrays per shape. The trainer holds about 6 batches at once at most (the one being trained,
# gpu_input._AHEAD ready and _UNDER_WAY per decoder set being decoded): with 8, every crop takes
# a given-back array once the first 8 batches are made. 8 [256, 224, 224, 3] uint8 arrays are
# 308 MB of a GPU's pool.
DEPTH = 8


class ImageRing:
    """uint8 image arrays on one device, kept after their batch and handed out once its owner is
    gone, for a program to donate. Thread-safe."""

    def __init__(self, depth: int = DEPTH) -> None:
        self._depth = depth
        self._lock = threading.Lock()
        # Per shape: (array, a weak reference to its owner), oldest first.
        self._kept: dict[tuple[int, ...], list[tuple[jax.Array, weakref.ref]]] = (
            collections.defaultdict(list)
        )

    def take(self, shape: tuple[int, ...]) -> jax.Array | None:
        """An array of `shape` whose owner is gone, no longer this ring's; None if none is."""
        with self._lock:
            kept = self._kept[tuple(shape)]
            for i, (array, owner) in enumerate(kept):
                if owner() is None:
                    del kept[i]
                    return array
        return None

    def give(self, array: jax.Array, owner: Any) -> None:
        """Keeps `array` (unless `depth` of its shape are kept) to hand out once `owner`, the
        object that reads it (its global batch), is garbage collected."""
        with self._lock:
            kept = self._kept[array.shape]
            if len(kept) < self._depth:
                kept.append((array, weakref.ref(owner)))

    def held(self) -> dict[tuple[int, ...], int]:
        """Arrays kept per shape."""
        with self._lock:
            return {shape: len(kept) for shape, kept in self._kept.items() if kept}
