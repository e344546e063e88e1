"""A CUDA stream on one GPU, made and synchronised through the CUDA driver API (libcuda).

nvImageCodec enqueues a decode on the stream it is given and returns before the GPU has run it;
JAX exposes none of its streams. So the GPU decoder (jia_jax/gpu_decode.py) decodes on a stream
of its own and waits for it on the host before XLA may read what it wrote. The driver library
is the one every CUDA program on the host loads (JAX's and nvImageCodec's included), so this
needs no package; the stream lives in the device's primary context, the context JAX and the
CUDA runtime (which nvImageCodec uses) share, so both may use it.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterator

_LIBRARY = "libcuda.so.1"
# CU_STREAM_NON_BLOCKING: not implicitly ordered after the legacy default stream (JAX's streams
# are non-blocking too), so the decoder never waits for work of other libraries by accident.
_NON_BLOCKING = 0x1
# The stream priorities `CudaStream` takes: the ends of the range the driver reports.
PRIORITIES = ("least", "greatest")


class CudaStream:
    """A non-blocking stream on the GPU of CUDA ordinal `ordinal` (a JAX device's
    `local_hardware_id`), of the `priority` CUDA calls least (its default) or greatest, or
    `existing`, a stream another library made in the device's primary context (e.g. XLA's,
    `jax.Device.get_stream_for_external_ready_events()`), used as it is. `handle` is the
    `cudaStream_t` as an integer.

    Raises:
      OSError: no CUDA driver on this host.
      RuntimeError: a driver call failed (its name and CUDA's error name say which and why).
    """

    def __init__(self, ordinal: int, priority: str = "least", existing: int | None = None
                 ) -> None:
        if priority not in PRIORITIES:
            raise ValueError(f"priority={priority!r}: least or greatest")
        self._cuda = ctypes.CDLL(_LIBRARY)
        self.call("cuInit", 0)
        device = ctypes.c_int()
        self.call("cuDeviceGet", ctypes.byref(device), ordinal)
        self._context = ctypes.c_void_p()
        # Retained for the life of the process, as JAX retains it: the stream must outlive
        # every decode, and the process ends with both.
        self.call("cuDevicePrimaryCtxRetain", ctypes.byref(self._context), device)
        if existing is not None:
            self.handle: int = existing
            return
        stream = ctypes.c_void_p()
        with self.current():
            least, greatest = ctypes.c_int(), ctypes.c_int()
            self.call("cuCtxGetStreamPriorityRange", ctypes.byref(least), ctypes.byref(greatest))
            chosen = least if priority == "least" else greatest
            self.call("cuStreamCreateWithPriority", ctypes.byref(stream), _NON_BLOCKING, chosen)
        self.handle = stream.value

    def synchronize(self) -> None:
        """Returns once the GPU has run everything enqueued on the stream (the GIL is released
        meanwhile: ctypes releases it around foreign calls)."""
        with self.current():
            self.call("cuStreamSynchronize", ctypes.c_void_p(self.handle))

    @contextlib.contextmanager
    def current(self) -> Iterator[None]:
        """The stream's context made current on this thread for the block, the thread's own
        restored after (the CUDA runtime of nvImageCodec keeps its state per thread)."""
        self.call("cuCtxPushCurrent_v2", self._context)
        try:
            yield
        finally:
            self.call("cuCtxPopCurrent_v2", ctypes.byref(ctypes.c_void_p()))

    def call(self, name: str, *args: object) -> None:
        """The driver function `name` called with `args`; its failure raised (RuntimeError)."""
        status = getattr(self._cuda, name)(*args)
        if status != 0:
            error = ctypes.c_char_p()
            self._cuda.cuGetErrorName(status, ctypes.byref(error))
            raise RuntimeError(f"{name} failed: {(error.value or b'?').decode()} ({status}).")
