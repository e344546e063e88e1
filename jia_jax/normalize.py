"""Image normalisation shared by the host pipeline and the jitted steps.

Real-data pipelines may hand the device uint8 pixels: a quarter of float32's bytes through the
worker processes and over PCIe, and no per-pixel arithmetic on the host CPU, which is the scarce
resource that feeds a GPU. The steps then normalise on the device, inside the first fusion.
"""

import jax.numpy as jnp
import numpy as np

# ImageNet channel statistics of pixel values in [0, 255] (RGB).
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32) * 255
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32) * 255


def model_input(image: jnp.ndarray, dtype: jnp.dtype) -> jnp.ndarray:
    """`image` as the model's input in `dtype`: uint8 pixels are normalised, floats only cast."""
    if image.dtype != jnp.uint8:
        return image.astype(dtype)
    return normalized(image, dtype)


def normalized(pixels: jnp.ndarray, dtype: jnp.dtype) -> jnp.ndarray:
    """(pixels - mean) / std in float32, computed as the host pipeline computes it
    (x * (1/std) + (-mean/std)), then rounded once to `dtype`; `pixels` in 0..255."""
    scale = jnp.asarray(1 / IMAGENET_STD, jnp.float32)
    shift = jnp.asarray(-IMAGENET_MEAN / IMAGENET_STD, jnp.float32)
    return (pixels.astype(jnp.float32) * scale + shift).astype(dtype)
