"""A stand-in for nvImageCodec on CPU hosts: the GPU input path's decoder, decoding with Pillow."""

import io

import jax
import numpy as np
import PIL.Image
import pytest

from jia_jax import gpu_decode


class PillowTileDecoder:
    """A `gpu_decode.TileDecoder` that decodes with Pillow and refuses what nvJPEG's hardware
    decoder refuses: anything but a baseline JPEG in colour or grey (so CMYK, PNG, progressive)."""

    def __init__(self, device: jax.Device) -> None:
        self.device = device

    def __call__(self, encoded, origins, canvas):
        return [self._tile(data, y, x, canvas) for data, (y, x) in zip(encoded, origins.tolist())]

    def _tile(self, data: np.ndarray, y: int, x: int, canvas: int) -> jax.Array | None:
        try:
            image = PIL.Image.open(io.BytesIO(data.tobytes()))
            baseline = image.format == "JPEG" and "progression" not in image.info
            if not baseline or image.mode not in ("RGB", "L"):
                return None
            pixels = np.asarray(image.convert("RGB"))
        except Exception:  # noqa: BLE001  undecodable bytes: the caller falls back
            return None
        tile = np.zeros((canvas, canvas, 3), np.uint8)
        region = pixels[y : y + canvas, x : x + canvas]
        tile[: region.shape[0], : region.shape[1]] = region
        return jax.device_put(tile, self.device)


@pytest.fixture
def fake_gpu(monkeypatch):
    """The GPU path on this CPU host, decoding with `PillowTileDecoder`."""
    monkeypatch.setattr(gpu_decode, "available", lambda: True)
    monkeypatch.setattr(gpu_decode, "new_decoder", PillowTileDecoder)
