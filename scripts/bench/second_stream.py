r"""Do kernels on a second CUDA stream slow the train step's kernels? (one GPU)

The train step's kernels run one after another on XLA's compute stream; the GPU input path's
decoders run theirs on streams of their own (docs/input_pipeline.md). This trains the trainer's
step (`step_thread.training`: ResNet-50 64K config, bf16, synthetic data) at --per_gpu images on
the first GPU in a thread and, with the step paused, does each action of --plan in turn, then
traces the step alone for --trace_seconds (how its stream's kernels followed one another:
`profile_trace.stream_boundaries` per step; None on CPU) and times it for --seconds more
(images/s, one step in flight ahead). Actions:

  * `alone`: none;
  * `kN`: N empty kernels on a second stream of this process (made by its first `k`);
  * `xN`: N empty kernels on a stream XLA made when JAX started (the device's stream for
    external ready events, `jax.Device.get_stream_for_external_ready_events()`): does a
    stream of XLA's own, as NCCL's kernels run on across processes, leave the step as it is?
  * `gN`: N empty kernels captured once into a CUDA graph on the second stream, the graph
    launched there (as XLA's command buffers launch the step's kernels);
  * `cN`: N empty kernels on the second stream, each launched as NCCL launches its own on
    Hopper GPUs (`cuLaunchKernelEx`, a cluster of 4 blocks in CUDA's remote
    memory-synchronisation domain);
  * `jN`: N runs of a small jitted program from this thread, each waited for: XLA's compute
    stream, from a thread other than the step's (as the GPU path's crop program runs);
  * `rN` / `yN`: N JPEGs (500 x 375, 4:2:0, 64 a call) decoded on the second stream by
    nvImageCodec's hardware decoder, as the GPU input path's decoders do: into interleaved RGB
    (`r`, nvJPEG converting the colours with a kernel of its own) or into planar YCbCr (`y`,
    as the hardware decoder writes them: no kernel, a copy);
  * `qN`: as `rN`, each call of the decoder captured into a CUDA graph on the second stream
    (relaxed capture) and the graph launched there, as `g` launches its kernels: can the
    decoders' work reach the GPU in graphs? The row records whether each capture held
    (`capture_error`, the first failure, else None) and the decoded pixels' mean beside
    Pillow's of the same JPEG (`decoded_mean`, `pillow_mean`: did the graph decode?);
  * `nN`: N empty kernels on a stream of a green context of this process (CUDA's partition of
    the GPU's SMs, `--green_sms` of them, made by the first `n`): does a context of its own
    within the process leave the step as another process's does?
  * `mN`: N JPEGs decoded into RGB as `rN` decodes them, on the green context's stream (made by
    the first `n` or `m`), the decoder made and run with that context current;
  * `pN`: N empty kernels on a stream of another process (a CUDA context of its own);
  * `hN`: N copies of 1 MiB from host memory to the GPU (`jax.device_put`, as the CPU input
    path hands over its batches), each waited for;
  * `destroy`: the second stream destroyed.

  python -m scripts.bench.second_stream --per_gpu 64 --plan alone k1 k1 k1 k2 k5 \
      --out=second_stream.json

The empty kernels are PTX loaded through the CUDA driver, so `k`, `g`, `c` and `p` need a GPU
(`c` one of compute capability 9.0 or later, for clusters); `r` and `y` need nvImageCodec and a
GPU with JPEG engines.
`--stream_priority` and `--sync_domain` give `k`'s stream what the stream of NCCL's kernels has
in a step across processes: CUDA's greatest priority (XLA's
`--xla_gpu_enable_highest_priority_async_stream`, on by default), and kernels in CUDA's remote
memory-synchronisation domain (where NCCL launches its own on Hopper GPUs,
`NCCL_MEM_SYNC_DOMAIN`'s default).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import io
import json
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

from jia_jax import cuda_stream
from scripts.bench import harness, step_thread

# cuStreamSetAttribute's CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN, and its values by name (cuda.h).
_MEM_SYNC_DOMAIN = 10
_SYNC_DOMAINS = {"default": 0, "remote": 1}

# An empty kernel in PTX for the oldest target the driver still compiles for any newer GPU, and
# for the oldest with thread-block clusters (Hopper's), which `c` launches.
_EMPTY_PTX = b""".version 7.0
.target sm_50
.address_size 64
.visible .entry empty()
{
  ret;
}
"""
_CLUSTER_PTX = _EMPTY_PTX.replace(b"7.0", b"7.8").replace(b"sm_50", b"sm_90")
# cuLaunchKernelEx's attributes (cuda.h's CUlaunchAttributeID) and NCCL's cluster size on Hopper
# (NCCL_CGA_CLUSTER_SIZE's default there).
_CLUSTER_DIMENSION = 4
_CLUSTER = 4
# cuStreamBeginCapture's CU_STREAM_CAPTURE_MODE_THREAD_LOCAL: other threads' CUDA calls go on;
# _RELAXED also lets the capturing thread allocate (as a decoder may for its output).
_CAPTURE_THREAD_LOCAL = 1
_CAPTURE_RELAXED = 2
_ACTIONS = ("k", "x", "g", "c", "j", "r", "y", "q", "n", "m", "p", "h")  # kN, xN, ...: N >= 1
# Those that launch on the second stream (made by the first), and the decodes' sample formats.
_STREAM_ACTIONS = ("k", "g", "c", "r", "y", "q")
_DECODED_INTO = {"r": "I_RGB", "y": "P_YUV", "q": "I_RGB"}
_DECODE_CALL = 64


class _LaunchAttribute(ctypes.Structure):
    """cuda.h's CUlaunchAttribute: an id, padded to 8 bytes, and a value of <= 64 bytes."""

    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4),
                ("value", ctypes.c_ubyte * 64)]


class _LaunchConfig(ctypes.Structure):
    """cuda.h's CUlaunchConfig."""

    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                ("shared_bytes", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_LaunchAttribute)), ("num_attrs", ctypes.c_uint)]


def parse_plan(tokens: Sequence[str]) -> list[tuple[str, int]]:
    """(action, count) per token of --plan: `alone` and `destroy` (count 0), `kN`, `xN`, `gN`,
    `cN`, `jN`, `rN`, `yN`, `qN`, `nN`, `mN`, `pN` and `hN` with N >= 1.

    Raises:
      ValueError: a token is none of these (the message names it and the forms), or a destroy
        has no second stream to destroy.
    """
    plan, stream = [], False  # whether a second stream exists at each action
    for token in tokens:
        if token in ("alone", "destroy"):
            if token == "destroy" and not stream:
                raise ValueError("--plan: each destroy needs a k, g, c, r, y or q action since the "
                                 "last destroy (no second stream to destroy)")
            stream = stream and token != "destroy"
            plan.append((token, 0))
        elif token[:1] in _ACTIONS and token[1:].isdigit() and int(token[1:]) >= 1:
            stream = stream or token[0] in _STREAM_ACTIONS
            plan.append((token[0], int(token[1:])))
        else:
            raise ValueError(f"--plan: {token!r} is not alone, destroy, kN, xN, gN, cN, jN, rN, "
                             "yN, qN, nN, mN, pN or hN (N >= 1)")
    return plan


class EmptyKernels:
    """An empty kernel launched on a stream of its own on the GPU of CUDA ordinal `ordinal`, or
    on the `existing` stream (XLA's), whose settings are left as XLA made them."""

    def __init__(self, ordinal: int, priority: str = "least", sync_domain: str = "default",
                 existing: int | None = None) -> None:
        self.stream = cuda_stream.CudaStream(ordinal, priority, existing)
        self._clustered: ctypes.c_void_p | None = None  # loaded by the first clustered launch
        with self.stream.current():
            if existing is None:
                value = (ctypes.c_char * 64)()  # CUstreamAttrValue, a union of <= 64 bytes
                ctypes.c_int.from_buffer(value).value = _SYNC_DOMAINS[sync_domain]
                self.stream.call("cuStreamSetAttribute", ctypes.c_void_p(self.stream.handle),
                                 _MEM_SYNC_DOMAIN, ctypes.byref(value))
            self._kernel = self._load(_EMPTY_PTX)

    @classmethod
    def on(cls, stream: Any) -> "EmptyKernels":
        """The empty kernel launched on `stream` (a `GreenStream`, or any stream used as a
        `cuda_stream.CudaStream` is), whose settings are left as they were made; the kernel
        loaded in the stream's context (a module is its context's)."""
        kernels = cls.__new__(cls)
        kernels.stream, kernels._clustered = stream, None
        with stream.current():
            kernels._kernel = kernels._load(_EMPTY_PTX)
        return kernels

    def _load(self, ptx: bytes) -> ctypes.c_void_p:
        """The kernel `empty` of `ptx`, compiled by the driver (its context current)."""
        module, kernel = ctypes.c_void_p(), ctypes.c_void_p()
        self.stream.call("cuModuleLoadData", ctypes.byref(module), ptx)
        self.stream.call("cuModuleGetFunction", ctypes.byref(kernel), module, b"empty")
        return kernel

    def launch(self, count: int) -> None:
        """`count` launches of one thread each, returned once the GPU has run them."""
        with self.stream.current():
            self._launch_each(count)
        self.stream.synchronize()

    def _launch_each(self, count: int) -> None:
        for _ in range(count):
            self.stream.call("cuLaunchKernel", self._kernel, 1, 1, 1, 1, 1, 1, 0,
                             ctypes.c_void_p(self.stream.handle), None, None)

    def launch_graph(self, count: int) -> None:
        """`count` launches captured into one CUDA graph, which is launched once on the stream;
        returned once the GPU has run it."""
        graph, handle = ctypes.c_void_p(), ctypes.c_void_p(self.stream.handle)
        with self.stream.current():
            self.stream.call("cuStreamBeginCapture_v2", handle, _CAPTURE_THREAD_LOCAL)
            self._launch_each(count)
            self.stream.call("cuStreamEndCapture", handle, ctypes.byref(graph))
        launch_graph(self.stream, graph)

    def launch_clustered(self, count: int) -> None:
        """`count` launches of a cluster of 4 one-thread blocks each in CUDA's remote
        memory-synchronisation domain, as NCCL launches its kernels on Hopper GPUs; returned
        once the GPU has run them."""
        attributes = (_LaunchAttribute * 2)()
        attributes[0].id = _CLUSTER_DIMENSION
        (ctypes.c_uint * 3).from_buffer(attributes[0].value)[:] = [_CLUSTER, 1, 1]
        attributes[1].id = _MEM_SYNC_DOMAIN
        ctypes.c_int.from_buffer(attributes[1].value).value = _SYNC_DOMAINS["remote"]
        config = _LaunchConfig((_CLUSTER, 1, 1), (1, 1, 1), 0, self.stream.handle,
                               attributes, len(attributes))
        with self.stream.current():
            if self._clustered is None:
                self._clustered = self._load(_CLUSTER_PTX)
            for _ in range(count):
                self.stream.call("cuLaunchKernelEx", ctypes.byref(config), self._clustered,
                                 None, None)
        self.stream.synchronize()

    def destroy(self) -> None:
        """The stream destroyed (the kernel's module stays loaded)."""
        with self.stream.current():
            self.stream.call("cuStreamDestroy_v2", ctypes.c_void_p(self.stream.handle))


class GreenStream:
    """A non-blocking stream of a green context holding `sms` (at least; CUDA rounds up) of the
    SMs of the GPU of CUDA ordinal `ordinal` (CUDA's green contexts, driver 12.4 and later),
    used as a `cuda_stream.CudaStream` is: `handle`, `current()` (the green context current),
    `synchronize()`, `call()`. `sms`: the SMs it got."""

    # cuda.h's CUdevResource: a type, 92 bytes of padding, the resource (an SM resource's
    # count first) and, from CUDA 13, a pointer: 144 bytes in CUDA 12 and 13 alike.
    _RESOURCE_BYTES, _SM_COUNT_AT, _SM_TYPE = 144, 96, 1
    _GREEN_DEFAULT_STREAM, _NON_BLOCKING = 1, 1

    def __init__(self, ordinal: int, sms: int) -> None:
        self._driver = cuda_stream.CudaStream(ordinal)  # the driver, its primary context
        self.call = self._driver.call
        device = ctypes.c_int()
        self.call("cuDeviceGet", ctypes.byref(device), ordinal)
        whole, part, rest = (ctypes.create_string_buffer(self._RESOURCE_BYTES) for _ in "abc")
        self.call("cuDeviceGetDevResource", device, whole, self._SM_TYPE)
        groups = ctypes.c_uint(1)
        self.call("cuDevSmResourceSplitByCount", part, ctypes.byref(groups), whole, rest, 0, sms)
        self.sms = ctypes.c_uint.from_buffer(part, self._SM_COUNT_AT).value
        desc, green = ctypes.c_void_p(), ctypes.c_void_p()
        self.call("cuDevResourceGenerateDesc", ctypes.byref(desc), part, 1)
        self.call("cuGreenCtxCreate", ctypes.byref(green), desc, device,
                  self._GREEN_DEFAULT_STREAM)
        self._context, stream = ctypes.c_void_p(), ctypes.c_void_p()
        self.call("cuCtxFromGreenCtx", ctypes.byref(self._context), green)
        self.call("cuGreenCtxStreamCreate", ctypes.byref(stream), green, self._NON_BLOCKING, 0)
        self.handle: int = stream.value

    @contextlib.contextmanager
    def current(self) -> Iterator[None]:
        """The green context current on this thread for the block."""
        self.call("cuCtxPushCurrent_v2", self._context)
        try:
            yield
        finally:
            self.call("cuCtxPopCurrent_v2", ctypes.byref(ctypes.c_void_p()))

    def synchronize(self) -> None:
        """Returns once the GPU has run everything enqueued on the stream."""
        self.call("cuStreamSynchronize", ctypes.c_void_p(self.handle))


def launch_graph(stream: Any, graph: ctypes.c_void_p) -> None:
    """`graph`, captured on `stream` (a `cuda_stream.CudaStream` or a `GreenStream`),
    instantiated and launched there; returned once the GPU has run it, the graph destroyed."""
    executable, handle = ctypes.c_void_p(), ctypes.c_void_p(stream.handle)
    with stream.current():
        stream.call("cuGraphInstantiateWithFlags", ctypes.byref(executable), graph, 0)
        stream.call("cuGraphLaunch", executable, handle)
    stream.synchronize()
    with stream.current():
        stream.call("cuGraphExecDestroy", executable)
        stream.call("cuGraphDestroy", graph)


class JpegDecodes:
    """nvImageCodec's hardware decoder, decoding one generated JPEG over and over on `stream`
    (a `cuda_stream.CudaStream` or a `GreenStream`) of the GPU of CUDA ordinal `ordinal`."""

    def __init__(self, ordinal: int, stream: cuda_stream.CudaStream) -> None:
        from nvidia import nvimgcodec  # pylint: disable=import-outside-toplevel

        self._nv, self._stream = nvimgcodec, stream
        with stream.current():  # the stream's context, whose memory and streams it takes
            self._decoder = nvimgcodec.Decoder(
                device_id=ordinal,
                backends=[nvimgcodec.Backend(nvimgcodec.BackendKind.HW_GPU_ONLY)])
        self._jpeg = _jpeg()
        self._code_streams = [nvimgcodec.CodeStream(self._jpeg) for _ in range(_DECODE_CALL)]
        self._io: tuple[list[Any], list[Any], int] | None = None  # decode_captured's

    def _params(self, sample_format: str):
        """nvImageCodec's decode parameters for `sample_format` (a `SampleFormat` name)."""
        # Planar YCbCr is the JPEG's own colour space, which nvImageCodec must be told to keep.
        colours = {"color_spec": self._nv.ColorSpec.UNCHANGED} if sample_format == "P_YUV" else {}
        return self._nv.DecodeParams(apply_exif_orientation=False,
                                     sample_format=getattr(self._nv.SampleFormat, sample_format),
                                     **colours)

    def decode(self, count: int, sample_format: str) -> None:
        """`count` decodes into `sample_format` (a `nvimgcodec.SampleFormat` name),
        `_DECODE_CALL` a call, returned once the GPU has run them.

        Raises:
          RuntimeError: the decoder refused a JPEG.
        """
        params = self._params(sample_format)
        for start in range(0, count, _DECODE_CALL):
            with self._stream.current():
                images = self._decoder.decode(
                    self._code_streams[:min(_DECODE_CALL, count - start)], params=params,
                    cuda_stream=self._stream.handle)
            if any(image is None for image in images):
                raise RuntimeError(f"the hardware decoder refused a JPEG into {sample_format}")
            self._stream.synchronize()

    def _capture_io(self) -> tuple[list[Any], list[Any], int]:
        """What a captured call reads and writes, made once: `_DECODE_CALL` code streams over
        page-locked host memory and as many images over one device allocation (a capture can
        neither copy from pageable memory nor allocate), and that allocation's address."""
        import numpy as np  # pylint: disable=import-outside-toplevel

        from jia_jax import gpu_decode  # pylint: disable=import-outside-toplevel

        if self._io is None:
            jpeg, image_bytes = self._jpeg, 375 * 500 * 3
            host, device = ctypes.c_void_p(), ctypes.c_uint64()
            with self._stream.current():
                self._stream.call("cuMemHostAlloc", ctypes.byref(host),
                                  ctypes.c_size_t(len(jpeg) * _DECODE_CALL), 0)
                self._stream.call("cuMemAlloc_v2", ctypes.byref(device),
                                  ctypes.c_size_t(image_bytes * _DECODE_CALL))
            pinned = np.ctypeslib.as_array(
                (ctypes.c_ubyte * (len(jpeg) * _DECODE_CALL)).from_address(host.value))
            pinned[:] = np.tile(np.frombuffer(jpeg, np.uint8), _DECODE_CALL)
            streams = [self._nv.CodeStream(pinned[i * len(jpeg):(i + 1) * len(jpeg)])
                       for i in range(_DECODE_CALL)]
            view = gpu_decode._DeviceView  # pylint: disable=protected-access
            images = [self._nv.as_image(view(device.value + i * image_bytes, 375, 500, 500),
                                        cuda_stream=self._stream.handle)
                      for i in range(_DECODE_CALL)]
            self._io = (streams, images, device.value)
        return self._io

    def decode_captured(self, count: int) -> dict[str, Any]:
        """`count` decodes into RGB, each call of `_DECODE_CALL` captured into a CUDA graph on
        the stream and the graph launched there; returned once the GPU has run them, with the
        first capture's failure (`capture_error`, None if every capture held; the calls stop
        at it) and the first image's mean pixel beside Pillow's."""
        import numpy as np  # pylint: disable=import-outside-toplevel
        import PIL.Image  # pylint: disable=import-outside-toplevel

        streams, images, device = self._capture_io()
        params, handle = self._params("I_RGB"), ctypes.c_void_p(self._stream.handle)
        report: dict[str, Any] = {"capture_error": None, "decoded_mean": None}
        for start in range(0, count, _DECODE_CALL):
            graph, calls = ctypes.c_void_p(), min(_DECODE_CALL, count - start)
            with self._stream.current():
                self._stream.call("cuStreamBeginCapture_v2", handle, _CAPTURE_RELAXED)
                try:
                    out = self._decoder.decode(streams[:calls], images=images[:calls],
                                               params=params, cuda_stream=self._stream.handle)
                    if any(image is None for image in out):
                        report["capture_error"] = "decode: a JPEG gave no image under capture"
                except Exception as e:  # pylint: disable=broad-except  # recorded, not raised
                    report["capture_error"] = f"decode: {type(e).__name__}: {e}"
                try:  # ended even after a failure: the stream must leave capture
                    self._stream.call("cuStreamEndCapture", handle, ctypes.byref(graph))
                except RuntimeError as e:
                    report["capture_error"] = report["capture_error"] or str(e)
            if report["capture_error"] is not None:
                return report
            launch_graph(self._stream, graph)
        first = np.zeros((375, 500, 3), np.uint8)
        with self._stream.current():
            self._stream.call("cuMemcpyDtoH_v2", first.ctypes.data_as(ctypes.c_void_p),
                              ctypes.c_uint64(device), ctypes.c_size_t(first.nbytes))
        report["decoded_mean"] = float(first.mean())
        with PIL.Image.open(io.BytesIO(self._jpeg)) as image:
            report["pillow_mean"] = float(np.asarray(image.convert("RGB")).mean())
        return report


def _jpeg() -> bytes:
    """A 500 x 375 JPEG of smooth colours (4:2:0, quality 90), as ImageNet's photographs are."""
    import numpy as np  # pylint: disable=import-outside-toplevel
    import PIL.Image  # pylint: disable=import-outside-toplevel

    coarse = np.random.default_rng(0).integers(0, 256, (6, 8, 3), dtype=np.uint8)
    encoded = io.BytesIO()
    PIL.Image.fromarray(coarse).resize((500, 375), PIL.Image.BICUBIC).save(
        encoded, format="JPEG", quality=90)
    return encoded.getvalue()


def xla_stream(device) -> int:
    """A stream XLA made for `device` when JAX started (GPUs only), as a `cudaStream_t`."""
    return device.get_stream_for_external_ready_events()


def other_process(ordinal: int, count: int) -> None:
    """`count` empty kernels launched by another process on GPU `ordinal`."""
    subprocess.run(
        [sys.executable, "-m", "scripts.bench.second_stream", f"--launch_only={count}",
         f"--ordinal={ordinal}"],
        check=True,
    )


def xla_programs(device, count: int) -> None:
    """`count` runs of a small jitted program on `device` from the calling thread, each waited
    for."""
    import jax  # pylint: disable=import-outside-toplevel
    import numpy as np  # pylint: disable=import-outside-toplevel

    data = jax.device_put(np.zeros(1024, np.float32), device)
    add_one = jax.jit(lambda x: x + 1)
    for _ in range(count):
        data = add_one(data).block_until_ready()


def host_copies(device, count: int) -> None:
    """`count` copies of 1 MiB from host memory to `device`, each waited for."""
    import jax  # pylint: disable=import-outside-toplevel
    import numpy as np  # pylint: disable=import-outside-toplevel

    data = np.zeros(1 << 20, np.uint8)
    for _ in range(count):
        jax.device_put(data, device).block_until_ready()


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    """A row per action of --plan (see the module's docstring)."""
    import jax  # pylint: disable=import-outside-toplevel

    device = jax.local_devices()[0]
    ordinal = getattr(device, "local_hardware_id", None) or 0
    side: EmptyKernels | None = None
    xla: EmptyKernels | None = None
    decodes: JpegDecodes | None = None  # on `side`'s stream
    green: EmptyKernels | None = None  # on a GreenStream
    green_decodes: JpegDecodes | None = None  # on `green`'s stream
    rows = []
    with step_thread.training(device, args.per_gpu, args) as times:
        for action, count in parse_plan(args.plan):
            times.run(False)
            if action in _STREAM_ACTIONS:
                side = side or EmptyKernels(ordinal, args.stream_priority, args.sync_domain)
            extra: dict[str, Any] = {}  # what the action reports beside the row
            if action in _DECODED_INTO:
                decodes = decodes or JpegDecodes(ordinal, side.stream)
                if action == "q":
                    extra = decodes.decode_captured(count)
                else:
                    decodes.decode(count, _DECODED_INTO[action])
            elif action in _STREAM_ACTIONS:
                {"k": side.launch, "g": side.launch_graph, "c": side.launch_clustered}[action](
                    count)
            elif action == "j":
                xla_programs(device, count)
            elif action == "x":
                xla = xla or EmptyKernels(ordinal, existing=xla_stream(device))
                xla.launch(count)
            elif action in ("n", "m"):
                green = green or EmptyKernels.on(GreenStream(ordinal, args.green_sms))
                if action == "n":
                    green.launch(count)
                else:
                    green_decodes = green_decodes or JpegDecodes(ordinal, green.stream)
                    green_decodes.decode(count, "I_RGB")
                extra = {"green_sms": green.stream.sms}
            elif action == "p":
                other_process(ordinal, count)
            elif action == "h":
                host_copies(device, count)
            elif action == "destroy":
                side.destroy()
                side, decodes = None, None
            rows.append({**_row(times, action, count, args), **extra})
            print(rows[-1], flush=True)
    return rows


def _row(
    times: step_thread.StepTimes, action: str, count: int, args: argparse.Namespace
) -> dict[str, Any]:
    """The step alone after `action`: traced for --trace_seconds, then timed for --seconds (the
    trace slows the steps it records, so they are not timed)."""
    row: dict[str, Any] = {"action": action, "count": count}
    _, row["traced_steps"], row["boundaries"] = step_thread.traced_steps(
        times, lambda: time.sleep(args.trace_seconds))
    first, start = len(times), time.perf_counter()
    time.sleep(args.seconds)
    times.run(False)
    row["seconds"] = time.perf_counter() - start
    finished = times[first:]
    row["timed_steps"] = len(finished)
    if len(finished) >= 2:  # over the steps finished, the wait for the first one left out
        row["train_images_per_s"] = (
            args.per_gpu * (len(finished) - 1) / (finished[-1] - finished[0]))
    return row


def main(argv: Sequence[str] | None = None) -> dict[str, Any] | None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per_gpu", type=int, default=64)
    parser.add_argument("--plan", nargs="+", default=["alone", "k1", "k1000", "alone"],
                        help="actions, each followed by a row: alone, kN, xN, gN, cN, jN, rN, yN, "
                        "qN, nN, mN, pN, hN, destroy")
    parser.add_argument("--seconds", type=float, default=6.0, help="each row's seconds timed")
    parser.add_argument("--trace_seconds", type=float, default=1.0,
                        help="each row's seconds traced, first")
    parser.add_argument("--stream_priority", choices=cuda_stream.PRIORITIES, default="least",
                        help="kN's stream: of CUDA's least (default) or greatest priority")
    parser.add_argument("--sync_domain", choices=tuple(_SYNC_DOMAINS), default="default",
                        help="kN's kernels: in CUDA's default or remote memory-sync domain")
    parser.add_argument("--train_model", default="resnet50")
    parser.add_argument("--train_compute_dtype", default="bfloat16")
    parser.add_argument("--tiny_model", action="store_true", help="a tiny model (CPU tests)")
    parser.add_argument("--green_sms", type=int, default=16,
                        help="nN's and mN's green context: at least this many SMs (CUDA rounds "
                        "up)")
    parser.add_argument("--launch_only", type=int, default=0,
                        help="internal (pN): launch this many empty kernels and exit")
    parser.add_argument("--ordinal", type=int, default=0, help="internal (pN): the GPU")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    if args.launch_only:
        EmptyKernels(args.ordinal).launch(args.launch_only)
        return None
    if not args.out:
        parser.error("--out is required")
    try:
        parse_plan(args.plan)
    except ValueError as e:
        parser.error(str(e))
    doc: dict[str, Any] = {"args": vars(args), "results": measure(args)}
    harness.close_record(args.out, doc)
    print(json.dumps(doc["results"], indent=1))
    return doc


if __name__ == "__main__":
    main()
