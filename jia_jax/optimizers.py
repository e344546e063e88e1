"""The optimizer named by `optimizer.name`, with the large-batch learning-rate schedule."""

from __future__ import annotations

import ml_collections
import optax

from jia_jax.lars import exclude_bias_and_norm, lars

OPTIMIZERS = ("sgd", "lars")


def create_optimizer(
    opt: ml_collections.ConfigDict, learning_rate: optax.Schedule
) -> optax.GradientTransformation:
    """SGD with momentum or LARS; neither decays nor LARS-scales bias and BatchNorm parameters.

    Args:
      opt: the `optimizer` config block.
      learning_rate: the global schedule (warmup + decay), indexed by step.

    Raises:
      ValueError: naming the field, for an unknown name or a value outside its range.
    """
    if not 0.0 <= opt.momentum < 1.0:
        raise ValueError(f"optimizer.momentum={opt.momentum} must be in [0, 1).")
    if opt.weight_decay < 0:
        raise ValueError(f"optimizer.weight_decay={opt.weight_decay} must be >= 0.")
    if opt.name == "lars" and opt.trust_coefficient <= 0:
        raise ValueError(f"optimizer.trust_coefficient={opt.trust_coefficient} must be > 0.")
    if opt.name == "sgd":
        return optax.chain(
            optax.add_decayed_weights(opt.weight_decay, mask=exclude_bias_and_norm),
            optax.sgd(learning_rate, momentum=opt.momentum or None, nesterov=opt.nesterov),
        )
    if opt.name == "lars":
        return lars(
            learning_rate,
            weight_decay=opt.weight_decay,
            trust_coefficient=opt.trust_coefficient,
            momentum=opt.momentum,
            nesterov=opt.nesterov,
        )
    raise ValueError(f"optimizer.name={opt.name!r} is not one of {OPTIMIZERS}.")
