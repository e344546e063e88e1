"""JPEG decoding on the GPU with nvImageCodec: a batch's tiles written into a device array.

A `TileDecoder` takes a batch's encoded images, per tile the region of its image the tile holds
(jia_jax/crop_resize.py plans them; a region is always inside its image), and a uint8
[count, canvas, canvas, 3] array on its device; it writes region t of image t into slot t at its
top-left corner, leaves every other pixel as it was, and returns per tile whether it decoded.
Where it did not (a CMYK JPEG, a PNG stored as JPEG, damaged bytes) the caller takes the CPU
path's example instead (jia_jax/gpu_input.py), whatever the slot holds.

`NvImageCodecDecoder` decodes a tile that holds a whole image (every image that fits in a canvas)
with the GPU's hardware JPEG engines where it has them (H100s do), which take whole images only;
a tile of a larger image, as a region of interest, and a whole image the engines refuse (a
progressive JPEG), with nvImageCodec's default backends. Both write straight into the tile's
slot: the slot's first rows and columns are handed to nvImageCodec as an image of the region's
shape with the slot's row pitch (`nvimgcodec.as_image` of a `__cuda_array_interface__`). At
start-up each decoder decodes a probe JPEG exactly so (a whole image; for the default backends a
region too) into a fresh array of zeros and is checked against Pillow, and for writing nothing
outside the regions. EXIF orientation is ignored, as Pillow (the CPU path) ignores it.

The array is written in place, behind XLA's back. That is safe here because
  * no XLA program reads or writes the array while the decoder writes. The GPU path takes the
    array from its device's `TileRing` (jia_jax/tile_ring.py), which hands each array to one
    holder at a time: a new one once its zeros are written (`new_tiles` waits for them, as
    nvImageCodec's stream is not ordered after XLA's), a reused one once the last program that
    read it (the previous holder's crop and resize, whose output the ring keeps) has finished.
    Nothing donates the array and XLA never writes an array its programs only read, so between
    holders no program touches it, and a holder enqueues its crop only after the decoder
    returns;
  * the decoder writes nothing outside the array: before any write it checks that the array is
    uint8 [count, canvas, canvas, 3] on its device and that every region fits a slot;
  * the decoder's writes are finished before it returns: every decode is enqueued on this
    decoder's own CUDA stream (jia_jax/cuda_stream.py), which the host synchronises before
    returning, also when a decode raises, so no write lands while XLA reads the array.

Install with `pip install -e ".[gpu]"`; nvImageCodec is imported only when a decoder is built.

GPU memory: the tiles are in XLA's pool. Each device's ring (one per decoder: a device has
`data.gpu_decode_depth` of them) keeps up to `tile_ring.DEPTH` (8) arrays per tile count,
8 x 256 x 512 x 512 x 3 bytes = 1.6 GB per count per ring at 256 ImageNet crops per GPU (canvas
512), and the crops that last read them (8 x 38.5 MB at 224). A batch of images that all fit in
a canvas needs one count; larger images add counts in steps of a quarter of the batch.
nvImageCodec allocates its own buffers with CUDA, outside the pool XLA
reserves at start-up (nvJPEG's state and its copies of the encoded bytes). JAX reserves
XLA_PYTHON_CLIENT_MEM_FRACTION of each GPU's memory (0.75 unless set), which leaves 20 GB of an
80 GB card; the trainer keeps that, and `check_memory_fraction` refuses a fraction that would
leave the decoder less than `MIN_HEADROOM`.
"""

from __future__ import annotations

import functools
import io
import threading
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np
import PIL.Image
from absl import logging

from jia_jax import cuda_stream
from jia_jax import nvimgcodec_quiet

# Share of GPU memory to leave outside XLA's pool for the decoder: 5% of an 80 GB GPU is 4 GB,
# four times what it needs.
MIN_HEADROOM = 0.05
_JAX_DEFAULT_FRACTION = 0.75
_PROBE_CANVAS = 256
# The start-up check's bound on the mean |difference| from Pillow over a probe region, in levels
# of 255. Two JPEG decoders differ by their IDCT's rounding and their chroma upsampling, a level
# or two on the smooth probe image; a region written at a wrong pitch, offset or channel order is
# tens of levels off.
_PROBE_LEVELS = 8.0
# JPEG components nvImageCodec decodes here: grey and colour. CMYK/YCCK JPEGs (4) go to Pillow,
# whose conversion to RGB is the CPU path's.
_CHANNELS = (1, 3)
# The option every decoder gets first (a given options string replaces the library's defaults,
# which differ between its versions): chroma upsampled by interpolation (1), as libjpeg-turbo
# (Pillow, the CPU path) upsamples it, or by repeating samples (0), faster. Repeating put a 4:2:0
# JPEG of the smoke check 11 levels of 255 from Pillow at most, 1.5 on average, where
# interpolating kept it within 1 (docs/input_pipeline.md).
_UPSAMPLING = ":fancy_upsampling={:d}"
# Bytes at the end of a JPEG searched for its end-of-image marker (padding after it is allowed).
_EOI_TAIL = 64
# CUDA runs the streams of a process through CUDA_DEVICE_MAX_CONNECTIONS hardware work queues (8
# unless set). XLA's streams and nvImageCodec's are more than 8, so a decoder's stream can share
# a queue with XLA's compute stream and wait there behind the train steps already queued: on one
# H100 the decode stage kept 730 images/s beside training with 8 queues, 7,082 with 32
# (docs/input_pipeline.md). The variable is read when CUDA starts, before JAX's first GPU call.
HARDWARE_QUEUES = ("CUDA_DEVICE_MAX_CONNECTIONS", "32")


class DecoderUnavailableError(RuntimeError):
    """nvImageCodec cannot decode a JPEG on this device."""


class TileDecoder(Protocol):
    """Decodes the tiles of a batch into an array on one device."""

    def __call__(
        self, encoded: Sequence[np.ndarray], regions: np.ndarray, tiles: jax.Array
    ) -> np.ndarray:
        """Writes into `tiles`, uint8 [count, canvas, canvas, 3] on this decoder's device that no
        XLA program reads or writes meanwhile, the pixels `regions[t]` = (top, left, bottom,
        right) of `encoded[t]` at slot t's top-left corner, t < len(encoded), and nothing
        else; returns bool [len(encoded)], whether slot t decoded (if not, it may hold
        anything). The writes are finished when it returns."""


def new_tiles(device: jax.Device, count: int, canvas: int) -> jax.Array:
    """uint8 zeros [count, canvas, canvas, 3] on `device`, written before this returns: XLA
    writes them on its own stream, which a decoder's stream is not ordered after (so this waits
    for the XLA work queued before them too, train steps included)."""
    tiles = jnp.zeros((count, canvas, canvas, 3), jnp.uint8, device=device)
    return tiles.block_until_ready()


def library_installed() -> bool:
    """Whether nvImageCodec's Python package is importable (without importing it)."""
    return nvimgcodec_quiet.package_folder() is not None


def available() -> bool:
    """Whether the GPU path can run here: a GPU backend and nvImageCodec."""
    return jax.default_backend() == "gpu" and library_installed()


def check_memory_fraction(environ: Mapping[str, str]) -> None:
    """Raises `ValueError` if XLA is set to reserve so much GPU memory that the decoder's
    buffers may not fit beside it (see the module docstring)."""
    if environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "true").lower() in ("false", "0"):
        return  # XLA allocates as it goes: no reservation to leave room beside
    fraction = float(environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", _JAX_DEFAULT_FRACTION))
    if fraction > 1 - MIN_HEADROOM:
        raise ValueError(
            f"XLA_PYTHON_CLIENT_MEM_FRACTION={fraction} leaves less than {MIN_HEADROOM:.0%} of "
            "GPU memory outside XLA's pool, where data.decode='gpu' keeps nvImageCodec's "
            f"buffers: set it to {1 - MIN_HEADROOM} or less, or use --config.data.decode=cpu."
        )


def cuda_environment(decode: str, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables to add to `environ` before CUDA starts in a process that may decode on the
    GPU (`data.decode` is not "cpu" and nvImageCodec is installed): `HARDWARE_QUEUES`, unless
    the user set that variable."""
    name, value = HARDWARE_QUEUES
    if decode == "cpu" or name in environ or not library_installed():
        return {}
    return {name: value}


def new_decoder(
    device: jax.Device, options: str = "", fancy_upsampling: bool = True
) -> TileDecoder:
    """The decoder the GPU path uses on `device` (tests replace this factory): chroma upsampled
    as Pillow does if `fancy_upsampling` (`data.gpu_fancy_upsampling`), with `options` for
    nvImageCodec's decoders besides that one (benchmarks compare some).

    Raises:
      DecoderUnavailableError: no CUDA stream or no working nvImageCodec decoder on `device`.
    """
    from nvidia import nvimgcodec  # pylint: disable=import-outside-toplevel

    try:
        stream = cuda_stream.CudaStream(_ordinal(device))
    except (OSError, RuntimeError) as e:
        raise DecoderUnavailableError(
            f"No CUDA stream for nvImageCodec on {device} ({e}); use --config.data.decode=cpu."
        ) from e
    return NvImageCodecDecoder(device, nvimgcodec, stream, options, fancy_upsampling)


def _ordinal(device: jax.Device) -> int:
    """`device`'s CUDA ordinal among the process's visible GPUs."""
    ordinal = getattr(device, "local_hardware_id", None)
    return device.id if ordinal is None else ordinal


class _Stream(Protocol):
    handle: int

    def synchronize(self) -> None: ...


class _Backend(NamedTuple):
    """An nvImageCodec decoder and whether it is given regions of interest."""

    decoder: Any
    takes_regions: bool


class _Work(NamedTuple):
    """A batch ready to decode: per tile its code stream and whether that is the whole image
    (None: left to Pillow), and the slots of the tiles that have one, by tile."""

    streams: list[tuple[Any, bool] | None]
    slots: dict[int, Any]


class _DeviceView:
    """Rows [0, height) and columns [0, width) of a slot, with the slot's row pitch, as a
    `__cuda_array_interface__` for `nvimgcodec.as_image`."""

    def __init__(self, pointer: int, height: int, width: int, canvas: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (height, width, 3),
            "typestr": "|u1",
            "data": (pointer, False),
            "strides": (canvas * 3, 3, 1),
            "version": 3,
        }


class NvImageCodecDecoder:
    """A `TileDecoder` on `device` with the `nvimgcodec` module: the hardware JPEG engines for
    whole images where they pass the start-up check, the default backends for the rest.

    Raises:
      DecoderUnavailableError: the default backends fail the start-up check.
    """

    def __init__(
        self,
        device: jax.Device,
        nvimgcodec: Any,
        stream: _Stream,
        options: str = "",
        fancy_upsampling: bool = True,
    ) -> None:
        self._nv = nvimgcodec
        self._device = device
        self._stream = stream
        self._options = f"{_UPSAMPLING.format(fancy_upsampling)} {options}".strip()
        self._params = nvimgcodec.DecodeParams(apply_exif_orientation=False)
        # One batch at a time per decoder: the train and eval streams share it.
        self._lock = threading.Lock()
        hardware = self._checked([nvimgcodec.Backend(nvimgcodec.BackendKind.HW_GPU_ONLY)])
        default = self._checked(None)
        if default is None:
            raise DecoderUnavailableError(
                f"nvImageCodec cannot decode a JPEG into a tile on {device} (the log says why); "
                "use --config.data.decode=cpu."
            )
        self._backends = [b for b in (hardware, default) if b is not None]

    def __call__(
        self, encoded: Sequence[np.ndarray], regions: np.ndarray, tiles: jax.Array
    ) -> np.ndarray:
        # The host's share of a batch runs outside the lock, so that it overlaps another batch's
        # decoding (jia_jax/gpu_input.py keeps two batches under way per decoder).
        work = self._prepared(encoded, regions, tiles)
        with self._lock:
            return self._decode(self._backends, work)

    def _prepared(
        self, encoded: Sequence[np.ndarray], regions: np.ndarray, tiles: jax.Array
    ) -> _Work:
        """The checks, each tile's code stream (its JPEG's header parsed) and its slot as an
        nvImageCodec image: what a batch's decoding needs from the host before the GPU works."""
        regions, extents = self._fitted(regions, tiles)
        canvas = tiles.shape[1]
        pointer, slot_bytes = tiles.unsafe_buffer_pointer(), canvas * canvas * 3
        regions, extents = regions.tolist(), extents.tolist()
        streams = [self._code_stream(e, r) for e, r in zip(encoded, regions, strict=True)]
        view = functools.partial(self._nv.as_image, cuda_stream=self._stream.handle)
        slots = {
            t: view(_DeviceView(pointer + t * slot_bytes, *extents[t], canvas))
            for t, s in enumerate(streams)
            if s is not None
        }
        return _Work(streams, slots)

    def _decode(self, backends: Sequence[_Backend], work: _Work) -> np.ndarray:
        """Each tile by the first of `backends` that takes and decodes it (see `__call__`)."""
        streams = work.streams
        decoded = np.zeros(len(streams), bool)
        try:
            for backend in backends:
                wanted = [
                    t
                    for t, s in enumerate(streams)
                    if s is not None and not decoded[t] and (backend.takes_regions or s[1])
                ]
                chosen = [streams[t][0] for t in wanted]
                slots = [work.slots[t] for t in wanted]
                decoded[wanted] = self._into(backend.decoder, chosen, slots)
        finally:
            self._stream.synchronize()  # every write done before XLA may read `tiles`
        return decoded

    def _fitted(self, regions: np.ndarray, tiles: jax.Array) -> tuple[np.ndarray, np.ndarray]:
        """`regions` as int64 [T, 4] and their heights and widths, [T, 2]; raises `ValueError`
        unless `tiles` is uint8 [count, canvas, canvas, 3] on this decoder's device and every
        region fits a slot: else nvImageCodec would write past a slot, or past the array, into
        memory XLA owns (or another device's)."""
        shape, devices = tiles.shape, tiles.devices()
        if (
            tiles.dtype != jnp.uint8
            or len(shape) != 4
            or shape[1] != shape[2]
            or shape[3] != 3
            or devices != {self._device}
        ):
            raise ValueError(
                f"Tiles {tiles.dtype} {shape} on {devices} are not uint8 [count, canvas, "
                f"canvas, 3] on {self._device}."
            )
        regions = np.asarray(regions, np.int64).reshape(-1, 4)
        extents = regions[:, 2:] - regions[:, :2]
        if len(regions) > shape[0] or np.any(extents > shape[1]):
            raise ValueError(
                f"{len(regions)} regions, up to {extents.max(0)} pixels, do not fit {shape[0]} "
                f"slots of {shape[1]} x {shape[2]}."
            )
        return regions, extents

    def _code_stream(self, data: np.ndarray, region: list[int]) -> tuple[Any, bool] | None:
        """The code stream of `region` of `data` and whether it is the whole image; None for
        what this decoder leaves to Pillow: bytes nvImageCodec cannot parse, anything but a grey
        or colour JPEG (a PNG, a CMYK JPEG), a JPEG cut short (no end-of-image marker at its
        end), a region not inside the image (a header that does not say what the host read)."""
        nv = self._nv
        top, left, bottom, right = region
        if not _ends_whole(data):
            return None
        try:
            stream = nv.CodeStream(data)
            if stream.codec_name != "jpeg" or stream.num_channels not in _CHANNELS:
                return None
            height, width = stream.height, stream.width
            if not (0 <= top < bottom <= height and 0 <= left < right <= width):
                return None
            if (top, left, bottom, right) == (0, 0, height, width):
                return stream, True
            return stream.get_sub_code_stream(region=nv.Region(top, left, bottom, right)), False
        except RuntimeError:  # a header the library cannot parse
            return None

    def _into(self, decoder: Any, streams: list[Any], slots: list[Any]) -> list[bool]:
        """Decodes `streams` into `slots` (nvImageCodec images) on this decoder's stream:
        whether each decoded."""
        if not streams:
            return []
        handle = self._stream.handle
        try:
            out = decoder.decode(streams, images=slots, params=self._params, cuda_stream=handle)
        except (RuntimeError, ValueError) as e:  # the whole call failed: the tiles go on
            logging.warning("nvImageCodec failed to decode %d tiles: %s", len(streams), e)
            return [False] * len(streams)
        return [image is not None for image in out]

    def _checked(self, backends: list[Any] | None) -> _Backend | None:
        """A decoder with `backends` (None: the default ones) if it passes the start-up check:
        the probe JPEG decoded whole, and for the default backends a region of it, into tiles,
        within `_PROBE_LEVELS` of Pillow, nothing written outside the regions."""
        nv, ordinal = self._nv, _ordinal(self._device)
        name = "hardware JPEG" if backends else "default"
        try:
            decoder = nv.Decoder(device_id=ordinal, backends=backends, options=self._options)
            backend = _Backend(decoder, backends is None)
            failure = self._probe(backend)
        except (RuntimeError, ValueError) as e:  # the library's errors (a bad buffer, no engine)
            failure = str(e)
        if failure:  # a warning: without the hardware decoder the input may be too slow
            logging.warning("nvImageCodec's %s backends on GPU %d: %s", name, ordinal, failure)
            return None
        logging.info("nvImageCodec decodes on GPU %d with its %s backends.", ordinal, name)
        return backend

    def _probe(self, backend: _Backend) -> str | None:
        """Why `backend` fails the start-up check (see `_checked`), or None."""
        encoded, pixels = _probe_image()
        height, width, _ = pixels.shape
        regions = [(0, 0, height, width)]
        if backend.takes_regions:  # inside the image, touching its right edge
            regions.append((8, 24, height - 6, width))
        # One slot more than the regions: nothing may be written there.
        tiles = new_tiles(self._device, len(regions) + 1, _PROBE_CANVAS)
        work = self._prepared([encoded] * len(regions), np.array(regions), tiles)
        decoded = self._decode([backend], work)
        if not decoded.all():
            return f"it did not decode a {width} x {height} JPEG into a tile."
        slots = np.asarray(tiles, np.int32)
        for slot, (top, left, bottom, right) in zip(slots, regions):
            got = slot[: bottom - top, : right - left]
            error = np.abs(got - pixels[top:bottom, left:right]).mean()
            if error > _PROBE_LEVELS:
                return f"region {(top, left, bottom, right)} is {error:.1f} levels from Pillow's."
            if slot[bottom - top :].any() or slot[:, right - left :].any():
                return f"it wrote past region {(top, left, bottom, right)} in its slot."
        if slots[len(regions) :].any():
            return "it wrote into a slot it was not given."
        return None


def _ends_whole(data: np.ndarray) -> bool:
    """Whether a JPEG's bytes end with its end-of-image marker (FF D9; a little padding after it
    is allowed). The hardware decoder decodes a JPEG cut short without an error, where Pillow,
    the CPU path, refuses it and the record is counted as damaged; without the marker the image
    goes to Pillow, which decides as the CPU path does."""
    tail = data[-_EOI_TAIL:].tobytes()
    return b"\xff\xd9" in tail


@functools.cache
def _probe_image() -> tuple[np.ndarray, np.ndarray]:
    """A baseline 4:2:0 JPEG like ImageNet's (smooth colours, quality 90), smaller than a probe
    tile, and Pillow's decoding of it."""
    rng = np.random.default_rng(0)
    coarse = PIL.Image.fromarray(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8))
    encoded = io.BytesIO()
    coarse.resize((200, 150), PIL.Image.BICUBIC).save(encoded, format="JPEG", quality=90)
    pixels = np.asarray(PIL.Image.open(io.BytesIO(encoded.getvalue())).convert("RGB"))
    return np.frombuffer(encoded.getvalue(), np.uint8), pixels
