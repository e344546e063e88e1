r"""Runs a module as `python -m` would, with the GPU path's decoders writing planar YCbCr.

A cost probe, not a way to train: nvJPEG converts each decoded image to RGB with a kernel of its
own (`ycbcr_to_format_kernel_roi`, the GPU path's largest kernel by time in a traced step at 256
images per GPU, docs/input_pipeline.md). Decoding into planar YCbCr (`P_YUV`, colours
unconverted), the hardware decoder runs no such kernel, only copies. Here every decoder of
jia_jax/gpu_decode.py is asked for that instead, written into the same tile slots (three planes of
the region's height, the slot's row pitch: nvImageCodec takes padding between rows only), and
skips its start-up check against Pillow (the colours are YCbCr now). The crop program reads the
planes as if they were RGB, so what the model sees is wrong; the work of every stage but the
colour conversion is the same. Trained so beside the GPU path as it is, the rates say what that
conversion costs the step.

  python -m scripts.bench.planar_decode -- -m jia_jax.main --config=configs/resnet50_64k.py \
      --config.data.decode=gpu ...
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from jia_jax import gpu_decode
from scripts.bench import wrapped_program


class PlanarView:
    """Planes 0-2 of rows [0, height) and columns [0, width) of a slot, each plane `height`
    rows of the slot's row pitch, as a `__cuda_array_interface__`: `3 * height * canvas` bytes
    from `pointer`, inside the slot's `canvas * canvas * 3` since `height <= canvas`."""

    def __init__(self, pointer: int, height: int, width: int, canvas: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (3, height, width),
            "typestr": "|u1",
            "data": (pointer, False),
            "strides": (height * canvas, canvas, 1),
            "version": 3,
        }


class _PlanarImages:
    """The `nvimgcodec` module with `as_image` describing planar YCbCr."""

    def __init__(self, nvimgcodec: Any) -> None:
        self._nv = nvimgcodec

    def __getattr__(self, name: str) -> Any:
        return getattr(self._nv, name)

    def as_image(self, source: Any, **kwargs: Any) -> Any:
        return self._nv.as_image(source, sample_format=self._nv.SampleFormat.P_YUV,
                                 color_spec=self._nv.ColorSpec.UNCHANGED, **kwargs)


def patch_decoders() -> None:
    """Makes every `gpu_decode.NvImageCodecDecoder` built from now on decode into planar
    YCbCr (see the module docstring)."""
    built = gpu_decode.NvImageCodecDecoder.__init__

    def planar(self: Any, device: Any, nvimgcodec: Any, *args: Any, **kwargs: Any) -> None:
        built(self, device, _PlanarImages(nvimgcodec), *args, **kwargs)
        self._params = nvimgcodec.DecodeParams(  # pylint: disable=protected-access
            apply_exif_orientation=False, sample_format=nvimgcodec.SampleFormat.P_YUV,
            color_spec=nvimgcodec.ColorSpec.UNCHANGED)

    gpu_decode.NvImageCodecDecoder.__init__ = planar
    gpu_decode.NvImageCodecDecoder._probe = lambda self, backend: None  # pylint: disable=protected-access
    gpu_decode._DeviceView = PlanarView  # pylint: disable=protected-access


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    wrapped_program.add_argument(parser)
    args = parser.parse_args(argv)
    program = wrapped_program.module_argv(parser, args.program)
    patch_decoders()
    wrapped_program.run(program)


if __name__ == "__main__":
    main()
