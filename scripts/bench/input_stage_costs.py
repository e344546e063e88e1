"""Per-image CPU cost of each stage of the train input pipeline, on one core (a probe, not a pipeline).

Generates 64 JPEGs like scripts/bench/input.py (500x375, smooth colour plus noise, quality 90) and
times decoding (Pillow, simplejpeg, OpenCV where installed), the crop-box resize, the numpy crop,
normalisation and batch stacking, in ms. Pin it to one core for the per-core figure:

  taskset -c 0 python -m scripts.bench.input_stage_costs
"""

import os
import time
from collections.abc import Callable

import numpy as np
import PIL.Image

from jia_jax import crop_windows, tfds_input
from scripts.bench import input as bench_input


def _jpegs(count: int) -> list[bytes]:
    rng = np.random.default_rng(0)
    return [bench_input.jpeg(rng) for _ in range(count)]


def _time(name: str, f: Callable[[int], object], n: int = 300) -> None:
    for i in range(5):
        f(i)
    start = time.perf_counter()
    for i in range(n):
        f(i)
    print(f"{name:40s} {(time.perf_counter() - start) / n * 1e3:.3f} ms")


def main() -> None:
    jpegs = _jpegs(64)
    print(
        "kb",
        np.mean([len(x) for x in jpegs]) / 1e3,
        "pillow",
        PIL.__version__,
        "affinity",
        os.sched_getaffinity(0),
    )
    decoded = [tfds_input._decode_rgb(x) for x in jpegs]
    arrays = [np.asarray(d) for d in decoded]
    rng = np.random.default_rng(1)
    boxes = [crop_windows.random_crop_box(rng, 500, 375) for _ in range(64)]

    def crop(i: int) -> np.ndarray:
        left, top, right, bottom = boxes[i % 64]
        return arrays[i % 64][top:bottom, left:right]

    _time("pil decode", lambda i: tfds_input._decode_rgb(jpegs[i % 64]))
    _time(
        "pil resize box",
        lambda i: np.asarray(
            decoded[i % 64].resize((224, 224), PIL.Image.BILINEAR, box=boxes[i % 64])
        ),
    )
    _time("pil asarray full", lambda i: np.asarray(decoded[i % 64]))
    _time("crop copy numpy", lambda i: np.ascontiguousarray(crop(i)))
    batch = {"image": np.zeros((128, 224, 224, 3), np.uint8)}
    _time(
        "normalize bf16, per batch of 128",
        lambda i: tfds_input._normalize(batch, dtype=np.dtype("bfloat16")),
        20,
    )
    images = [np.zeros((224, 224, 3), np.uint8)] * 128
    _time("stack 128 uint8, per batch of 128", lambda i: np.stack(images), 50)
    try:
        import simplejpeg
    except ImportError as e:
        print(e)
    else:
        _time(
            "simplejpeg decode", lambda i: simplejpeg.decode_jpeg(jpegs[i % 64], colorspace="RGB")
        )
    try:
        import cv2
    except ImportError as e:
        print(e)
    else:
        cv2.setNumThreads(1)
        _time(
            "cv2 imdecode",
            lambda i: cv2.imdecode(np.frombuffer(jpegs[i % 64], np.uint8), cv2.IMREAD_COLOR),
        )
        _time(
            "cv2 resize linear",
            lambda i: cv2.resize(crop(i), (224, 224), interpolation=cv2.INTER_LINEAR),
        )
        _time(
            "cv2 resize area",
            lambda i: cv2.resize(crop(i), (224, 224), interpolation=cv2.INTER_AREA),
        )


if __name__ == "__main__":
    main()
