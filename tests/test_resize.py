"""The device-side resize (jia_jax/resize.py) against Pillow, the host pipeline's reference.

Tolerances, in pixel levels (0..255):
  * float32: Pillow rounds to uint8 after its horizontal pass and again after its vertical one
    (each off by at most 0.5; the vertical weights are non-negative and sum to 1, so the first
    error passes on undiminished), while the device keeps floats: |device - Pillow| <= 1. Pillow's
    22-bit fixed-point coefficients and float32 weight arithmetic add about 1e-3 at most.
  * bfloat16 matmuls (the model's compute dtype): each weight is rounded to 8 significant bits
    (relative 2^-9; weights sum to 1, pixels <= 255: <= 0.5 per pass, two passes) and the
    intermediate image is rounded to bf16 (spacing 1 above 128: <= 0.5), so 1.5 on top of
    Pillow's 1: 2.5.
"""

import jax.numpy as jnp
import numpy as np
import PIL.Image
import pytest

from jia_jax import normalize, resize, tfds_input

_CANVAS = (384, 512)
_F32_TOL, _BF16_TOL = 1.0 + 1e-2, 2.5


def _noise(rng, width, height):
    # Noise is the worst case for resampling differences: neighbouring pixels are unrelated.
    return PIL.Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def _as_batch(fields):
    return {k: jnp.asarray(v)[None] for k, v in fields.items()}


def _cases():
    """(image, box, flip, out_size): landscape, portrait (stored transposed), too large for the
    canvas (resized on the host), tiny (upsampled), and boxes at the image's edges."""
    rng = np.random.default_rng(0)
    sizes = [(500, 375), (375, 500), (640, 480), (60, 40), (300, 300)]
    for trial in range(30):
        width, height = sizes[trial % len(sizes)]
        image = _noise(rng, width, height)
        box = tfds_input.random_crop_box(np.random.default_rng(trial), width, height)
        out_size = 32 if width < 100 else 224
        yield image, box, trial % 2 == 0, out_size
    image = _noise(rng, 500, 375)
    yield image, (0, 0, 500, 375), False, 224  # the whole image
    yield image, (480, 355, 500, 375), True, 224  # a 20-pixel corner, upsampled 11x


@pytest.mark.parametrize("dtype, tol", [(jnp.float32, _F32_TOL), (jnp.bfloat16, _BF16_TOL)])
def test_device_resize_matches_pillow(dtype, tol):
    kinds = set()
    for image, box, flip, out_size in _cases():
        expected = np.asarray(image.resize((out_size, out_size), PIL.Image.BILINEAR, box=box))
        expected = expected[:, ::-1] if flip else expected
        fields = tfds_input._window_on_canvas(image, box, out_size, _CANVAS, flip)
        got = np.asarray(resize.crops_to_images(_as_batch(fields), out_size, dtype))[0]
        assert got.shape == expected.shape
        np.testing.assert_allclose(got, expected, atol=tol, rtol=0)
        kinds.add(
            "host"
            if tuple(fields[resize.BOX]) == (0, 0, out_size, out_size)
            else "transposed"
            if fields[resize.TRANSPOSE]
            else "window"
        )
    assert kinds == {"window", "transposed", "host"}


def test_the_window_holds_every_tap_of_the_box():
    """Resizing the window (box + margin) equals resizing the box within the whole image."""
    rng = np.random.default_rng(1)
    for trial in range(20):
        image = _noise(rng, 300, 200)
        box = tfds_input.random_crop_box(np.random.default_rng(trial), 300, 200)
        window = tfds_input._window_on_canvas(image, box, 64, _CANVAS, flip=False)
        whole = np.zeros((*_CANVAS, 3), np.uint8)
        whole[:200, :300] = np.asarray(image)
        left, top, right, bottom = box
        full = {
            "image": whole,
            resize.BOX: np.asarray((top, left, bottom, right), np.float32),
            resize.SIZE: np.asarray((200, 300), np.int32),
            resize.TRANSPOSE: np.int32(0),
            resize.FLIP: np.int32(0),
        }
        from_window = resize.crops_to_images(_as_batch(window), 64, jnp.float32)
        from_whole = resize.crops_to_images(_as_batch(full), 64, jnp.float32)
        # Same weights on the same pixels, shifted: float32 rounding of the tap positions only.
        np.testing.assert_allclose(from_window, from_whole, atol=1e-3, rtol=0)


def test_weights_are_pillows_triangle_filter():
    """Hand-computed: 4 pixels to 2 (scale 2, support 2 taps each side) and 2 to 4 (scale 0.5)."""
    down = resize.axis_weights(
        jnp.array([0.0]), jnp.array([4.0]), jnp.array([4]), out_size=2, length=5
    )[0]
    # Output 0: centre 1.0, taps x in [0, 3): triangle((x + 0.5 - 1) / 2) = 0.75, 0.75, 0.25.
    np.testing.assert_allclose(down[0], np.array([0.75, 0.75, 0.25, 0, 0]) / 1.75, atol=1e-6)
    # Output 1: centre 3.0, taps [1, 4) (clipped at the image's 4 pixels): 0.25, 0.75, 0.75.
    np.testing.assert_allclose(down[1], np.array([0, 0.25, 0.75, 0.75, 0]) / 1.75, atol=1e-6)
    up = resize.axis_weights(
        jnp.array([0.0]), jnp.array([2.0]), jnp.array([2]), out_size=4, length=2
    )[0]
    # Output 0: centre 0.25, taps [0, 1): only pixel 0. Output 1: centre 0.75: 0.75 / 0.25.
    np.testing.assert_allclose(up, [[1, 0], [0.75, 0.25], [0.25, 0.75], [0, 1]], atol=1e-6)


def test_device_normalisation_is_the_host_normalisation():
    pixels = np.random.default_rng(2).integers(0, 256, (2, 5, 7, 3), dtype=np.uint8)
    host = tfds_input._normalize({"image": pixels}, dtype=np.dtype(np.float32))["image"]
    device = np.asarray(normalize.model_input(jnp.asarray(pixels), jnp.float32))
    # The same float32 multiply-add; a fused multiply-add may differ in the last bit.
    np.testing.assert_allclose(device, host, rtol=0, atol=4 * np.finfo(np.float32).eps)
    reference = (pixels.astype(np.float64) - normalize.IMAGENET_MEAN) / normalize.IMAGENET_STD
    np.testing.assert_allclose(device, reference, rtol=0, atol=1e-5)
