"""ResNet v1.5 (He et al. 2016; stride on the 3x3 conv of the bottleneck), NHWC, Flax linen.

Mixed precision: convolutions and activations run in ``dtype`` (bf16/fp16/fp32), parameters are
stored in ``param_dtype`` (fp32 master weights). BatchNorm statistics, the global average pool and
the classifier run in fp32 whatever ``dtype`` is, and the logits are returned in fp32.
"""

from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jia_jax.models import layers

# He et al. 2015 normal init; fan_out as torchvision's ResNet (with BatchNorm after every conv
# the choice of fan only sets the scale BN removes anyway).
_conv_init = nn.initializers.variance_scaling(2.0, "fan_out", "normal")
# Goyal et al. 2017, sec. 5.1: the classifier is drawn from N(0, 0.01^2).
_classifier_init = nn.initializers.normal(stddev=0.01)

ModuleDef = Callable[..., nn.Module]

# depth -> (block kind, blocks per stage), He et al. 2016, table 1.
_ARCHITECTURES: dict[int, tuple[str, tuple[int, ...]]] = {
    18: ("basic", (2, 2, 2, 2)),
    34: ("basic", (3, 4, 6, 3)),
    50: ("bottleneck", (3, 4, 6, 3)),
    101: ("bottleneck", (3, 4, 23, 3)),
}


def _pad(kernel: int) -> Sequence[tuple[int, int]]:
    # Symmetric k//2 padding, as the Caffe/torchvision definitions; 'SAME' pads strided convs
    # asymmetrically, which shifts the sampling grid relative to those references.
    return ((kernel // 2, kernel // 2),) * 2


class BasicBlock(nn.Module):
    """Two 3x3 convs (ResNet-18/34). Output channels: ``features``."""

    features: int
    strides: int
    conv: ModuleDef
    norm: ModuleDef

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        """Applies the block to an NHWC batch."""
        y = self.conv(self.features, (3, 3), self.strides, padding=_pad(3), name="conv1")(x)
        y = self.norm(name="bn1")(y, relu=True)
        y = self.conv(self.features, (3, 3), padding=_pad(3), name="conv2")(y)
        shortcut = _shortcut(x, y.shape, self.strides, self.conv, self.norm)
        # Zero gamma: the residual branch starts at 0, so the block starts as the identity
        # (Goyal et al. 2017, sec. 5.1), which is what makes very large batches trainable early on.
        return self.norm(scale_init=nn.initializers.zeros, name="bn2")(y, shortcut, relu=True)


class BottleneckBlock(nn.Module):
    """1x1 -> 3x3 (strided, v1.5) -> 1x1 convs (ResNet-50/101). Output channels: 4*``features``."""

    features: int
    strides: int
    conv: ModuleDef
    norm: ModuleDef

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        """Applies the block to an NHWC batch."""
        y = self.conv(self.features, (1, 1), name="conv1")(x)
        y = self.norm(name="bn1")(y, relu=True)
        # v1.5: the stride sits here, not on the first 1x1 conv as in the original v1.
        y = self.conv(self.features, (3, 3), self.strides, padding=_pad(3), name="conv2")(y)
        y = self.norm(name="bn2")(y, relu=True)
        y = self.conv(4 * self.features, (1, 1), name="conv3")(y)
        shortcut = _shortcut(x, y.shape, self.strides, self.conv, self.norm)
        return self.norm(scale_init=nn.initializers.zeros, name="bn3")(y, shortcut, relu=True)


def _shortcut(
    x: jax.Array, shape: tuple[int, ...], strides: int, conv: ModuleDef, norm: ModuleDef
) -> Callable[[], jax.Array]:
    """Identity, or a strided 1x1 projection + BN where the residual branch changes the shape.

    Returned as a function for the branch's last BN to call (`layers.BatchNormAct`); the layers
    are made here, so that they belong to the block, not to that BN.
    """
    if x.shape == shape:
        return lambda: x
    proj_conv = conv(shape[-1], (1, 1), strides, name="proj_conv")
    proj_bn = norm(name="proj_bn")
    return lambda: proj_bn(proj_conv(x))


class ResNet(nn.Module):
    """ResNet v1.5 classifier.

    Attributes:
      num_classes: Number of output logits.
      depth: 18 or 34 (basic blocks), 50 or 101 (bottleneck blocks).
      width: Channels of the stem and of the first stage (64 in the standard nets); stage i has
        ``width * 2**i`` (times 4 at the output of a bottleneck).
      dtype: Compute dtype of convolutions and activations.
      param_dtype: Storage dtype of the parameters.
      bn_momentum: Running-average decay of the BatchNorm statistics.
      bn_epsilon: BatchNorm epsilon.
      bn_axis_name: Mesh axis over which BatchNorm averages its batch statistics (the module
        must then run inside shard_map over that axis); None = statistics of the local
        (per-device) batch, as Goyal et al.
      small_inputs: Stem for 8x8..32x32 images: one 3x3 stride-1 conv and no max-pool, instead
        of the 7x7 stride-2 conv and 3x3 stride-2 max-pool sized for 224x224.
      space_to_depth_stem: The 7x7/2 stem conv computed as a 4x4 stride-1 conv on the 2x2
        space-to-depth input of 12 channels (`space_to_depth.py`): the same function and the
        same 7x7x3 kernel parameter. No effect with ``small_inputs`` (its stem has stride 1).
      sliced_max_pool: The stem's 3x3/2 max-pool as a maximum over strided slices that keeps
        the winning tap (`max_pool.py`): the same function and gradient (ties to the first
        maximum in window order, as flax's), with an elementwise backward instead of XLA's
        select-and-scatter.
    """

    num_classes: int
    depth: int = 50
    width: int = 64
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    bn_momentum: float = 0.9
    bn_epsilon: float = 1e-5
    bn_axis_name: str | None = None
    small_inputs: bool = False
    space_to_depth_stem: bool = False
    sliced_max_pool: bool = False

    def __post_init__(self) -> None:
        if self.depth not in _ARCHITECTURES:
            raise ValueError(
                f"ResNet depth {self.depth} is not supported; use one of {sorted(_ARCHITECTURES)}."
            )
        super().__post_init__()

    @nn.compact
    def __call__(self, x: jax.Array, train: bool) -> jax.Array:
        """Maps an NHWC image batch to fp32 logits of shape (batch, num_classes).

        Args:
          x: Images, (batch, height, width, channels).
          train: Normalise with the batch statistics and update the running averages
            (``batch_stats`` must then be mutable); otherwise use the running averages.
        """
        # Bias-free: every conv is followed by BN, whose bias makes a conv bias redundant.
        conv = layers.conv(self, _conv_init)
        norm = layers.batch_norm(self, train)  # fp32 statistics, output in dtype
        kind, stage_sizes = _ARCHITECTURES[self.depth]
        block_cls = BasicBlock if kind == "basic" else BottleneckBlock

        if self.small_inputs:
            x = conv(self.width, (3, 3), padding=_pad(3), name="stem_conv")(x)
            x = norm(name="stem_bn")(x, relu=True)
        else:
            stem_conv = layers.stem_conv(self, _conv_init)
            x = stem_conv(self.width, (7, 7), 2, padding=_pad(7), name="stem_conv")(x)
            x = norm(name="stem_bn")(x, relu=True)
            x = layers.max_pool(self)(x, (3, 3), (2, 2), ((1, 1), (1, 1)))

        for stage, num_blocks in enumerate(stage_sizes):
            for block in range(num_blocks):
                x = block_cls(
                    features=self.width * 2**stage,
                    strides=2 if stage > 0 and block == 0 else 1,
                    conv=conv,
                    norm=norm,
                    name=f"stage{stage + 1}_block{block + 1}",
                )(x)

        # The pool and the classifier run in fp32: they are ~0.05% of ResNet-50's FLOPs, and fp32
        # logits avoid bf16's 8-bit mantissa (~0.4% per logit) in the softmax/label-smoothing
        # loss and fp16 overflow; casting bf16 logits afterwards would not restore those bits.
        x = jnp.mean(x.astype(jnp.float32), axis=(1, 2))
        return layers.classifier(self, _classifier_init, "classifier")(x)
