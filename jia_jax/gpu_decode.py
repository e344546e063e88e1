"""JPEG decoding on the GPU with nvImageCodec: tiles of an image straight into device memory.

A `TileDecoder` takes encoded images and the (y, x) origin of each tile wanted, and returns each
tile as a uint8 [canvas, canvas, 3] RGB `jax.Array` on its device, zeros past the image's edge,
or None where it cannot decode it (a CMYK JPEG, a PNG stored as JPEG, damaged bytes): the caller
decodes those with Pillow on the CPU instead (jia_jax/gpu_input.py).

`NvImageCodecDecoder` asks nvImageCodec for each tile as a region of interest with
out-of-bounds fill, so the library decodes only that window (on H100s, with the hardware JPEG
engines) into a buffer of the tile's fixed shape, which DLPack hands to JAX without a copy.
EXIF orientation is ignored, as Pillow (the CPU path) ignores it.

Install with `pip install -e ".[gpu]"`; nvImageCodec is imported only when a decoder is built.

GPU memory: the decoder allocates its buffers with CUDA, outside the pool XLA reserves at
start-up: the tiles of the batch being decoded (256 x 512 x 512 x 3 bytes = 0.2 GB per GPU at 256
ImageNet crops per GPU) and nvJPEG's own, about 1 GB in all. JAX reserves
XLA_PYTHON_CLIENT_MEM_FRACTION of each GPU's memory (0.75 unless set), which leaves 20 GB of an
80 GB card; the trainer keeps that, and `check_memory_fraction` refuses a fraction that would
leave the decoder less than `MIN_HEADROOM`.
"""

from __future__ import annotations

import importlib.util
import io
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np
import PIL.Image
from absl import logging

# Share of GPU memory to leave outside XLA's pool for the decoder: 5% of an 80 GB GPU is 4 GB,
# four times what it needs.
MIN_HEADROOM = 0.05
_JAX_DEFAULT_FRACTION = 0.75
_PROBE_CANVAS = 256


class DecoderUnavailableError(RuntimeError):
    """nvImageCodec cannot decode a JPEG on this device."""


class TileDecoder(Protocol):
    """Decodes tiles of encoded images onto one device."""

    def __call__(
        self, encoded: Sequence[np.ndarray], origins: np.ndarray, canvas: int
    ) -> list[jax.Array | None]:
        """Tile i: the [canvas, canvas, 3] uint8 region at `origins[i]` = (y, x) of
        `encoded[i]` (zeros past its edge), on this decoder's device; None where undecodable."""


def library_installed() -> bool:
    """Whether nvImageCodec's Python package is importable (without importing it)."""
    try:
        return importlib.util.find_spec("nvidia.nvimgcodec") is not None
    except ModuleNotFoundError:  # no `nvidia` namespace package at all
        return False


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


def new_decoder(device: jax.Device) -> TileDecoder:
    """The decoder the GPU path uses on `device` (tests replace this factory)."""
    return NvImageCodecDecoder(device)


class NvImageCodecDecoder:
    """Tiles decoded by nvImageCodec on `device`: its hardware JPEG engines where it has them,
    else whichever backends the library picks."""

    def __init__(self, device: jax.Device) -> None:
        from nvidia import nvimgcodec  # pylint: disable=import-outside-toplevel

        self._nvimgcodec = nvimgcodec
        self._device = device
        self._params = nvimgcodec.DecodeParams(apply_exif_orientation=False)
        # One decode at a time per decoder: the train and eval streams share it.
        self._lock = threading.Lock()
        self._decoder = self._create()

    def _create(self) -> Any:
        """A decoder on the hardware JPEG engines if one decodes a probe tile, else one with
        nvImageCodec's default backends."""
        nv = self._nvimgcodec
        ordinal = getattr(self._device, "local_hardware_id", None)
        ordinal = self._device.id if ordinal is None else ordinal
        hardware = [nv.Backend(nv.BackendKind.HW_GPU_ONLY)]
        probe, origin = _probe_jpeg(), np.array([[8, 8]])
        for backends in (hardware, None):
            try:
                decoder = nv.Decoder(device_id=ordinal, backends=backends)
                if self._decode(decoder, [probe], origin, _PROBE_CANVAS)[0] is not None:
                    logging.info(
                        "nvImageCodec decodes on GPU %d with %s backends.",
                        ordinal,
                        "the hardware JPEG" if backends else "its default",
                    )
                    return decoder
            except RuntimeError as e:
                logging.info("nvImageCodec backends %s unavailable: %s", backends, e)
        raise DecoderUnavailableError(
            f"nvImageCodec cannot decode a JPEG tile on {self._device} (its log says why); "
            "use --config.data.decode=cpu."
        )

    def __call__(
        self, encoded: Sequence[np.ndarray], origins: np.ndarray, canvas: int
    ) -> list[jax.Array | None]:
        with self._lock:
            return self._decode(self._decoder, encoded, origins, canvas)

    def _decode(
        self, decoder: Any, encoded: Sequence[np.ndarray], origins: np.ndarray, canvas: int
    ) -> list[jax.Array | None]:
        nv = self._nvimgcodec
        streams, wanted = [], []
        for data, (y, x) in zip(encoded, origins.tolist(), strict=True):
            try:
                region = nv.Region(y, x, y + canvas, x + canvas)
                streams.append(nv.CodeStream(data).get_sub_code_stream(region=region))
                wanted.append(len(streams) - 1)
            except RuntimeError:  # a header the library cannot parse
                wanted.append(None)
        images = decoder.decode(streams, params=self._params) if streams else []
        return [None if k is None else self._to_jax(images[k], canvas) for k in wanted]

    def _to_jax(self, image: Any, canvas: int) -> jax.Array | None:
        if image is None:
            return None
        if image.buffer_kind == self._nvimgcodec.ImageBufferKind.STRIDED_HOST:
            array = jax.device_put(np.asarray(image.cpu()), self._device)
        else:
            array = jax.dlpack.from_dlpack(image)
        if array.shape != (canvas, canvas, 3) or array.dtype != jnp.uint8:
            return None
        return array


def _probe_jpeg() -> np.ndarray:
    """A baseline 4:2:0 JPEG like ImageNet's, smaller than a probe tile at its origin, to check
    at start-up that a decoder decodes a tile and fills past the image's edge."""
    encoded = io.BytesIO()
    pixels = np.arange(200 * 150 * 3, dtype=np.uint8).reshape(150, 200, 3)
    PIL.Image.fromarray(pixels).save(encoded, format="JPEG", quality=90)
    return np.frombuffer(encoded.getvalue(), np.uint8)
