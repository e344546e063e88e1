"""Where each example is cropped: the windows both input paths resize to the training size.

The CPU path (jia_jax/tfds_input.py) decodes a JPEG and resizes the window with Pillow; the GPU
path (jia_jax/gpu_input.py) reads only the JPEG's header on the host, draws the same window here,
and decodes and resizes it on the device. Both call these functions with the same per-example
generator in the same order (window, then flip), so a given (seed, step, example) gets the same
window on either path.
"""

import math

import numpy as np

EVAL_CROP_FRACTION = 0.875
CROP_AREA_RANGE = (0.08, 1.0)
CROP_RATIO_RANGE = (3 / 4, 4 / 3)
CROP_ATTEMPTS = 10

Box = tuple[float, float, float, float]


def random_crop_box(rng: np.random.Generator, width: int, height: int) -> tuple[int, int, int, int]:
    """(left, top, right, bottom) of a random-resized crop, in pixels.

    Samples area uniformly in 8-100% of the image and the aspect ratio log-uniformly in 3/4-4/3,
    up to 10 times until the box fits; otherwise the largest centred box whose aspect ratio is
    clamped to that range.
    """
    area = width * height
    log_ratio = (math.log(CROP_RATIO_RANGE[0]), math.log(CROP_RATIO_RANGE[1]))
    for _ in range(CROP_ATTEMPTS):
        target_area = area * rng.uniform(*CROP_AREA_RANGE)
        ratio = math.exp(rng.uniform(*log_ratio))
        w = round(math.sqrt(target_area * ratio))
        h = round(math.sqrt(target_area / ratio))
        if 0 < w <= width and 0 < h <= height:
            left = int(rng.integers(0, width - w + 1))
            top = int(rng.integers(0, height - h + 1))
            return left, top, left + w, top + h
    ratio = min(max(width / height, CROP_RATIO_RANGE[0]), CROP_RATIO_RANGE[1])
    if width / height <= ratio:
        w, h = width, round(width / ratio)
    else:
        w, h = round(height * ratio), height
    left, top = (width - w) // 2, (height - h) // 2
    return left, top, left + w, top + h


def train_window(rng: np.random.Generator, width: int, height: int) -> tuple[Box, bool]:
    """The random-resized crop box and whether to flip it horizontally (p = 0.5), drawn in
    that order from `rng`: the whole train augmentation of one example."""
    box = random_crop_box(rng, width, height)
    return box, bool(rng.random() < 0.5)


def eval_crop_box(width: int, height: int) -> Box:
    """(left, top, right, bottom) of the centred square of 0.875 of the shorter side."""
    side = EVAL_CROP_FRACTION * min(width, height)
    left, top = (width - side) / 2, (height - side) / 2
    return left, top, left + side, top + side
