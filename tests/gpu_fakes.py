"""A stand-in for nvImageCodec on CPU hosts: the part of its Python API the GPU input path uses,
decoding with Pillow into the device buffers it is handed (jax's CPU buffers here), so that
`gpu_decode.NvImageCodecDecoder` itself runs in the tests."""

import ctypes
import io
from typing import NamedTuple

import numpy as np
import PIL.Image
import PIL.ImageFile
import pytest

from jia_jax import gpu_decode

HARDWARE = "HW_GPU_ONLY"


class Region(NamedTuple):
    top: int
    left: int
    bottom: int
    right: int


class CodeStream:
    """An encoded image's header, as nvImageCodec parses it; `region` set for a sub-stream."""

    def __init__(self, data: np.ndarray, region: Region | None = None) -> None:
        self.data, self.region = data, region
        try:
            with PIL.Image.open(io.BytesIO(data.tobytes())) as image:
                self.codec_name = image.format.lower()
                self.width, self.height = image.size
                self.num_channels = len(image.getbands())
                self.progressive = bool(image.info.get("progressive"))
        except OSError as e:
            raise RuntimeError("Failed to get image info") from e

    def get_sub_code_stream(self, region: Region) -> "CodeStream":
        return CodeStream(self.data, region)


class Image:
    """`nvimgcodec.as_image` of a `__cuda_array_interface__`: a pointer, a shape, strides."""

    def __init__(self, source, cuda_stream: int = 0) -> None:
        interface = source.__cuda_array_interface__
        assert interface["typestr"] == "|u1" and interface["version"] >= 2
        self.pointer, _ = interface["data"]
        self.shape, self.strides = interface["shape"], interface["strides"]
        self.cuda_stream = cuda_stream

    def write(self, pixels: np.ndarray) -> None:
        """`pixels` into the buffer, row by row at the buffer's pitch, as nvImageCodec writes
        into an external buffer; raises `ValueError` where they do not fit, as it does."""
        if pixels.shape != tuple(self.shape):
            raise ValueError(f"Existing buffer {self.shape} is too small for {pixels.shape}")
        height, width, channels = self.shape
        pitch = self.strides[0]
        size = (height - 1) * pitch + width * channels
        memory = np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(self.pointer))
        view = np.lib.stride_tricks.as_strided(memory, self.shape, self.strides)
        view[...] = pixels


class Decoder:
    """Decodes with Pillow. With the hardware backend, like nvJPEG's engines: whole baseline
    JPEGs only (no region of interest, no progressive JPEG). Either way, like nvImageCodec:
    None for what does not decode (damaged bytes), regions only inside the image."""

    def __init__(
        self, library: "FakeNvImageCodec", device_id: int, backends=None, options: str = ""
    ) -> None:
        self.library, self.device_id = library, device_id
        library.options.append(options)
        self.hardware = backends == [HARDWARE]
        if self.hardware and not library.has_hardware:
            raise RuntimeError("Could not create decoder. Code: 7")

    def decode(self, streams, *, images, params, cuda_stream):
        assert len(images) == len(streams) and params == {"apply_exif_orientation": False}
        self.library.gate()
        return [self._one(s, i, cuda_stream) for s, i in zip(streams, images, strict=True)]

    def _one(self, stream: CodeStream, image: Image, cuda_stream: int) -> Image | None:
        assert cuda_stream == image.cuda_stream != 0  # one stream, not the legacy default
        if self.hardware and (stream.region is not None or stream.progressive):
            return None
        region = stream.region or Region(0, 0, stream.height, stream.width)
        if region.bottom > stream.height or region.right > stream.width:
            return None  # "Out of bounds region is not supported"
        try:
            with PIL.Image.open(io.BytesIO(stream.data.tobytes())) as decoded:
                PIL.ImageFile.LOAD_TRUNCATED_IMAGES = self.library.decodes_cut_jpegs
                try:
                    pixels = np.asarray(decoded.convert("RGB"))
                finally:
                    PIL.ImageFile.LOAD_TRUNCATED_IMAGES = False
        except OSError:
            return None
        pixels = pixels[region.top : region.bottom, region.left : region.right]
        if self.library.ignores_pitch:  # a library that writes rows back to back
            image.strides = (pixels.shape[1] * 3, 3, 1)
        image.write(pixels)
        self.library.decoded.append(("hardware" if self.hardware else "default", region))
        return image


class FakeNvImageCodec:
    """The `nvimgcodec` module's stand-in; `decoded` logs (backend, region) per decoded tile."""

    class BackendKind:
        HW_GPU_ONLY = HARDWARE

    Region = Region
    CodeStream = CodeStream

    def __init__(
        self,
        has_hardware: bool = True,
        ignores_pitch: bool = False,
        decodes_cut_jpegs: bool = False,
    ) -> None:
        self.has_hardware, self.ignores_pitch = has_hardware, ignores_pitch
        # As the H200's JPEG engines did: a JPEG cut short decodes, its missing rows filled in.
        self.decodes_cut_jpegs = decodes_cut_jpegs
        self.decoded: list[tuple[str, Region]] = []
        self.options: list[str] = []  # each decoder's options, as created
        self.gate = lambda: None  # called as each decode call starts (a test may hold it there)

    @staticmethod
    def Backend(kind):  # noqa: N802  nvImageCodec's name
        return kind

    @staticmethod
    def DecodeParams(**params):  # noqa: N802
        return params

    @staticmethod
    def as_image(source, cuda_stream: int = 0) -> Image:
        return Image(source, cuda_stream)

    def Decoder(self, device_id: int, backends=None, options: str = "") -> Decoder:  # noqa: N802
        return Decoder(self, device_id, backends, options)


class FakeStream:
    """A CUDA stream's stand-in: counts the host's synchronisations."""

    handle = 7

    def __init__(self) -> None:
        self.synchronized = 0

    def synchronize(self) -> None:
        self.synchronized += 1


@pytest.fixture
def fake_gpu(monkeypatch):
    """The GPU path on this CPU host: `NvImageCodecDecoder` over `FakeNvImageCodec`."""
    library = FakeNvImageCodec()
    monkeypatch.setattr(gpu_decode, "available", lambda: True)
    monkeypatch.setattr(
        gpu_decode,
        "new_decoder",
        lambda device, options="", fancy_upsampling=True: gpu_decode.NvImageCodecDecoder(
            device, library, FakeStream(), options, fancy_upsampling
        ),
    )
    return library
