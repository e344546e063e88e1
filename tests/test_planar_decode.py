"""scripts/bench/planar_decode.py: the GPU path's decoders, patched, write planar YCbCr into
their tile slots as nvImageCodec takes it (three planes of the region's height, padding between
rows only), and nothing else; over a stand-in for nvImageCodec that decodes with Pillow."""

import ctypes
import io

import jax
import jax.numpy as jnp
import numpy as np
import PIL.Image

from jia_jax import gpu_decode
from scripts.bench import planar_decode
from tests.gpu_fakes import Decoder, FakeNvImageCodec, FakeStream, Image, Region

_CANVAS = 32
_PLANAR = {"sample_format": "P_YUV", "color_spec": "UNCHANGED"}


class _PlanarImage(Image):
    """A planar image's buffer; refuses strides with padding other than between rows, as
    nvImageCodec does ("Padding is only allowed for rows")."""

    def __init__(self, source, cuda_stream: int = 0) -> None:
        super().__init__(source, cuda_stream)
        _, height, _ = self.shape
        plane, row, column = self.strides
        if column != 1 or plane != height * row:
            raise RuntimeError("Unexpected array style. Padding is only allowed for rows.")

    def write(self, pixels: np.ndarray) -> None:
        assert pixels.shape == tuple(self.shape)
        channels, height, width = self.shape
        size = (channels - 1) * self.strides[0] + (height - 1) * self.strides[1] + width
        memory = np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(self.pointer))
        np.lib.stride_tricks.as_strided(memory, self.shape, self.strides)[...] = pixels


class _PlanarDecoder(Decoder):
    def decode(self, streams, *, images, params, cuda_stream):
        assert params == {"apply_exif_orientation": False, **_PLANAR}
        for stream, image in zip(streams, images, strict=True):
            region = stream.region or Region(0, 0, stream.height, stream.width)
            image.write(_planes(stream.data)[:, region.top:region.bottom, region.left:region.right])
        return images


class _PlanarLibrary(FakeNvImageCodec):
    class SampleFormat:
        P_YUV = "P_YUV"

    class ColorSpec:
        UNCHANGED = "UNCHANGED"

    @staticmethod
    def as_image(source, cuda_stream: int = 0, **formats) -> Image:
        assert formats == _PLANAR
        return _PlanarImage(source, cuda_stream)

    def Decoder(self, device_id: int, backends=None, options: str = "") -> Decoder:  # noqa: N802
        return _PlanarDecoder(self, device_id, backends, options)


def _planes(data: np.ndarray) -> np.ndarray:
    """Pillow's YCbCr of a JPEG, [3, height, width]."""
    with PIL.Image.open(io.BytesIO(data.tobytes())) as image:
        return np.asarray(image.convert("YCbCr")).transpose(2, 0, 1)


def _jpeg(height: int, width: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    coarse = PIL.Image.fromarray(rng.integers(0, 256, (3, 4, 3), dtype=np.uint8))
    encoded = io.BytesIO()
    coarse.resize((width, height), PIL.Image.BICUBIC).save(encoded, format="JPEG", quality=90)
    return np.frombuffer(encoded.getvalue(), np.uint8)


def test_patched_decoders_write_planar_ycbcr_into_each_slot_and_nothing_else(monkeypatch):
    for name in ("__init__", "_probe"):  # restored after the test
        monkeypatch.setattr(gpu_decode.NvImageCodecDecoder, name,
                            getattr(gpu_decode.NvImageCodecDecoder, name))
    monkeypatch.setattr(gpu_decode, "_DeviceView", gpu_decode._DeviceView)
    planar_decode.patch_decoders()
    decoder = gpu_decode.NvImageCodecDecoder(jax.devices()[0], _PlanarLibrary(), FakeStream())
    # Whole images (one as tall as a slot) and a region inside a larger image.
    encoded = [_jpeg(20, 27, 0), _jpeg(32, 32, 1), _jpeg(50, 70, 2)]
    regions = np.array([[0, 0, 20, 27], [0, 0, 32, 32], [5, 9, 37, 30]])
    tiles = jnp.full((4, _CANVAS, _CANVAS, 3), 7, jnp.uint8).block_until_ready()
    assert decoder(encoded, regions, tiles).all()
    slots = np.asarray(tiles).reshape(4, -1)
    for slot, data, (top, left, bottom, right) in zip(slots, encoded, regions, strict=False):
        height, width = bottom - top, right - left
        planes = slot[: 3 * height * _CANVAS].reshape(3, height, _CANVAS)
        np.testing.assert_array_equal(planes[:, :, :width],
                                      _planes(data)[:, top:bottom, left:right])
        assert (planes[:, :, width:] == 7).all() and (slot[3 * height * _CANVAS:] == 7).all()
    assert (slots[3] == 7).all()  # a slot given no image
