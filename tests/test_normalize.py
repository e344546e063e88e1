"""Device-side normalisation of uint8 pixels (jia_jax/normalize.py) against the host's."""

import jax.numpy as jnp
import numpy as np

from jia_jax import normalize, tfds_input


def test_device_normalisation_is_the_host_normalisation():
    pixels = np.random.default_rng(2).integers(0, 256, (2, 5, 7, 3), dtype=np.uint8)
    host = tfds_input._normalize({"image": pixels}, dtype=np.dtype(np.float32))["image"]
    device = np.asarray(normalize.model_input(jnp.asarray(pixels), jnp.float32))
    # The same float32 multiply-add; a fused multiply-add may differ in the last bit.
    np.testing.assert_allclose(device, host, rtol=0, atol=4 * np.finfo(np.float32).eps)
    reference = (pixels.astype(np.float64) - normalize.IMAGENET_MEAN) / normalize.IMAGENET_STD
    np.testing.assert_allclose(device, reference, rtol=0, atol=1e-5)


def test_the_train_step_normalises_uint8_batches_as_the_host_would():
    """Gradients of a uint8 batch equal those of the host-normalised float32 batch (float32
    compute: the same inputs up to the last bit of one multiply-add, so 1e-5 relative)."""
    import jax

    from jia_jax import models, train

    model = models.create_model(
        "resnet18", num_classes=10, dtype="float32", width=4, small_inputs=True
    )
    pixels = np.random.default_rng(3).integers(0, 256, (4, 16, 16, 3), dtype=np.uint8)
    # Jitted: one compile each instead of hundreds of op-by-op dispatches (and their compiles).
    variables = jax.jit(
        lambda: model.init(jax.random.key(0), jnp.zeros((1, 16, 16, 3)), train=False)
    )()
    grads_fn = jax.jit(train.local_grads_fn(model, jnp.float32, smoothing=0.0))
    host = tfds_input._normalize({"image": pixels}, dtype=np.dtype(np.float32))["image"]
    label = jnp.arange(4, dtype=jnp.int32)
    args = (variables["params"], variables["batch_stats"], jnp.float32(1))
    key = jax.random.key(1)
    from_uint8 = grads_fn(*args, {"image": jnp.asarray(pixels), "label": label}, key)
    from_host = grads_fn(*args, {"image": jnp.asarray(host), "label": label}, key)
    for a, b in zip(jax.tree.leaves(from_uint8), jax.tree.leaves(from_host), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
