"""AlexNet with BatchNorm (AlexNet-BN of You et al. 2017 / Jia et al. 2018), NHWC, Flax linen.

Layout: the original widths of Krizhevsky et al. 2012 (96/256/384/384/256 convs, 4096/4096 fc) as
one tower (no two-GPU channel groups), the widths of the AlexNet-BN that LARS was demonstrated on;
padding as torchvision, so a 224x224 image reaches pool5 as 6x6x256 = 9216 features.
Each conv and the fc6/fc7 layers are followed by BatchNorm then ReLU (BN replaces the original
LRN), and one more BatchNorm normalises the pool5 output, the addition of Jia et al. 2018.
fc8 (the classifier) has no BatchNorm: its outputs are the logits.

Mixed precision as in resnet.py: compute in ``dtype``, parameters in ``param_dtype``, BatchNorm
statistics and the classifier in fp32, logits returned in fp32.
"""

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jia_jax.models import layers

_kernel_init = nn.initializers.variance_scaling(2.0, "fan_out", "normal")
_classifier_init = nn.initializers.normal(stddev=0.01)

# Widths of conv1..conv5 and of fc6/fc7 in units of width/3 (width=96 gives 96/256/384/384/256
# and 4096), so a tiny test net keeps the proportions of the real one.
_CONV_UNITS = (3, 8, 12, 12, 8)
_FC_UNITS = 128
_POOL5_SIZE = 6


def adaptive_avg_pool(x: jax.Array, output_size: int) -> jax.Array:
    """Averages an NHWC map to ``output_size`` x ``output_size``, as torch's AdaptiveAvgPool2d.

    Output cell i averages input rows floor(i*H/out) .. ceil((i+1)*H/out) - 1 (likewise for
    columns), so a map smaller than the output has its cells repeated. Computed in fp32.

    Args:
      x: (batch, height, width, channels).
      output_size: Side of the square output.

    Returns:
      (batch, output_size, output_size, channels) in the dtype of ``x``.
    """
    if x.shape[1:3] == (output_size, output_size):
        return x

    def averaging_matrix(size: int) -> np.ndarray:
        m = np.zeros((output_size, size), np.float32)
        for i in range(output_size):
            start, end = (i * size) // output_size, -(-((i + 1) * size) // output_size)
            m[i, start:end] = 1.0 / (end - start)
        return m

    y = jnp.einsum(
        "ih,jw,nhwc->nijc",
        averaging_matrix(x.shape[1]),
        averaging_matrix(x.shape[2]),
        x.astype(jnp.float32),
    )
    return y.astype(x.dtype)


class AlexNetBN(nn.Module):
    """AlexNet-BN classifier.

    Attributes:
      num_classes: Number of output logits.
      width: Channels of conv1 (96 in the standard net); the other layers keep the original
        proportions (rounded down): convs 8/3, 4, 4, 8/3 and fc6/fc7 128/3 times ``width``.
      dtype: Compute dtype of convolutions, fc layers and activations.
      param_dtype: Storage dtype of the parameters.
      bn_momentum: Running-average decay of the BatchNorm statistics.
      bn_epsilon: BatchNorm epsilon.
      bn_axis_name: Mesh axis over which BatchNorm averages its batch statistics (the module
        must then run inside shard_map over that axis); None = per-device statistics.
      dropout_rate: Dropout after fc6 and fc7; 0 (off) by default because BatchNorm after every
        fc layer already regularises through its batch-statistics noise (Ioffe & Szegedy 2015
        dropped dropout from BN-Inception for this reason). Above 0, ``train=True`` needs a
        'dropout' RNG.
      small_inputs: For 8x8..32x32 images: conv1 becomes 3x3 stride 1 and the three 3x3
        stride-2 max-pools pad by 1 (output ceil(H/2)), so an 8x8 image reaches pool5 as 1x1.
        Whatever pool5's size, an adaptive average pool brings it to 6x6 (the identity at
        224x224 with the standard stem), so fc6 keeps its 9216*width/96-wide input.
      space_to_depth_stem: conv1 (11x11, stride 4) computed as a 3x3 stride-1 conv on the 4x4
        space-to-depth input of 48 channels (`space_to_depth.py`): the same function and the
        same 11x11x3 kernel parameter. No effect with ``small_inputs`` (its conv1 has stride 1).
      sliced_max_pool: The three 3x3/2 max-pools with the elementwise backward of
        `max_pool.py` (the same function and gradient), as ResNet's option of that name.
    """

    num_classes: int
    width: int = 96
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    bn_momentum: float = 0.9
    bn_epsilon: float = 1e-5
    bn_axis_name: str | None = None
    dropout_rate: float = 0.0
    small_inputs: bool = False
    space_to_depth_stem: bool = False
    sliced_max_pool: bool = False

    @nn.compact
    def __call__(self, x: jax.Array, train: bool) -> jax.Array:
        """Maps an NHWC image batch to fp32 logits of shape (batch, num_classes).

        Args:
          x: Images, (batch, height, width, channels).
          train: Normalise with the batch statistics and update the running averages
            (``batch_stats`` must then be mutable), and apply dropout if enabled.
        """
        # No biases before BN: BN subtracts the batch mean, so such a bias gets zero gradient.
        conv = layers.conv(self, _kernel_init)
        dense = functools.partial(
            nn.Dense,
            use_bias=False,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            kernel_init=_kernel_init,
        )
        norm = layers.batch_norm(self, train)  # fp32 statistics, output in dtype
        pool_padding = ((1, 1), (1, 1)) if self.small_inputs else "VALID"

        def max_pool(y: jax.Array) -> jax.Array:
            return layers.max_pool(self)(y, (3, 3), (2, 2), pool_padding)

        c1, c2, c3, c4, c5 = (self.width * u // 3 for u in _CONV_UNITS)
        if self.small_inputs:
            x = conv(c1, (3, 3), padding=((1, 1), (1, 1)), name="conv1")(x)
        else:
            stem_conv = layers.stem_conv(self, _kernel_init)
            x = stem_conv(c1, (11, 11), 4, padding=((2, 2), (2, 2)), name="conv1")(x)
        x = max_pool(norm(name="conv1_bn")(x, relu=True))
        x = conv(c2, (5, 5), padding=((2, 2), (2, 2)), name="conv2")(x)
        x = max_pool(norm(name="conv2_bn")(x, relu=True))
        x = conv(c3, (3, 3), padding=((1, 1), (1, 1)), name="conv3")(x)
        x = norm(name="conv3_bn")(x, relu=True)
        x = conv(c4, (3, 3), padding=((1, 1), (1, 1)), name="conv4")(x)
        x = norm(name="conv4_bn")(x, relu=True)
        x = conv(c5, (3, 3), padding=((1, 1), (1, 1)), name="conv5")(x)
        x = max_pool(norm(name="conv5_bn")(x, relu=True))
        x = norm(name="pool5_bn")(x)
        x = adaptive_avg_pool(x, _POOL5_SIZE)
        x = x.reshape(x.shape[0], -1)

        fc_width = self.width * _FC_UNITS // 3
        for name in ("fc6", "fc7"):
            x = dense(fc_width, name=name)(x)
            x = norm(name=f"{name}_bn")(x, relu=True)
            if self.dropout_rate > 0:
                # Named: its mask is drawn from its name, so the name must stay for a resumed
                # run to draw the masks it would have drawn.
                x = nn.Dropout(
                    self.dropout_rate, deterministic=not train, name=f"{name}_dropout"
                )(x)

        # fp32 classifier, as in resnet.py: 4.1M of this net's ~1.1G multiply-adds per image.
        return layers.classifier(self, _classifier_init, "fc8")(x)
