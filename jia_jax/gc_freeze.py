"""Python's garbage collector kept off what the trainer built before its steps.

A full pass of Python's collector (generation 2) walks every object the process tracks, with
the interpreter lock held: after JAX, Flax and the compiled step are built, hundreds of
thousands of objects, which nearly all live as long as the process. Meanwhile the thread
handing steps to the device waits; a pass longer than the steps queued ahead leaves the device
idle. `gc.freeze()` moves every object alive at that moment to a generation the collector never
walks, so later passes look only at what the steps themselves allocate.
"""

from __future__ import annotations

import gc
from types import TracebackType


class GcFreeze:
    """`freeze()` collects once and freezes what survives (the first call only); leaving the
    `with` block unfreezes it, so a process that trains in-process (a notebook) gets its
    collector back as it was."""

    def __init__(self) -> None:
        self.frozen = False

    def freeze(self) -> None:
        """Collects, then freezes every object left; a no-op once frozen."""
        if self.frozen:
            return
        gc.collect()  # what is garbage now is not frozen
        gc.freeze()
        self.frozen = True

    def __enter__(self) -> GcFreeze:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self.frozen:
            gc.unfreeze()
            self.frozen = False
