"""Image classifiers: ResNet v1.5 and AlexNet-BN, chosen by the config's ``model.name``."""

from typing import Any

import flax.linen as nn
import jax.numpy as jnp
from jax.typing import DTypeLike

from jia_jax.models.alexnet import AlexNetBN
from jia_jax.models.resnet import ResNet

_RESNET_DEPTHS = {"resnet18": 18, "resnet34": 34, "resnet50": 50, "resnet101": 101}
MODEL_NAMES = (*_RESNET_DEPTHS, "alexnet_bn")

__all__ = ["MODEL_NAMES", "AlexNetBN", "ResNet", "create_model"]


def create_model(name: str, *, num_classes: int, dtype: DTypeLike, **overrides: Any) -> nn.Module:
    """Builds the classifier named by ``model.name``.

    Args:
      name: One of ``MODEL_NAMES``.
      num_classes: Number of output logits.
      dtype: Compute dtype, a dtype or its name ('bfloat16', 'float16', 'float32').
      **overrides: Further fields of the model class (e.g. ``width=8, small_inputs=True``).

    Returns:
      An unbound Flax module; call ``init(rngs, x, train=False)`` and ``apply(vars, x, train=...)``.

    Raises:
      ValueError: For an unknown name, or a ``depth`` override that contradicts a ResNet's name.

    Example:
      >>> model = create_model("resnet18", num_classes=10, dtype="bfloat16", width=8)
    """
    dtype = jnp.dtype(dtype)
    if name in _RESNET_DEPTHS:
        depth = _RESNET_DEPTHS[name]
        if overrides.pop("depth", depth) != depth:
            raise ValueError(f"model.depth contradicts model.name {name!r} (depth {depth}).")
        return ResNet(num_classes=num_classes, depth=depth, dtype=dtype, **overrides)
    if name == "alexnet_bn":
        return AlexNetBN(num_classes=num_classes, dtype=dtype, **overrides)
    raise ValueError(f"Unknown model.name {name!r}; valid names: {', '.join(MODEL_NAMES)}.")
