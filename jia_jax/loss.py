"""Classification loss and accuracy, always in fp32 whatever the compute dtype."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def cross_entropy(logits: jax.Array, labels: jax.Array, label_smoothing: float = 0.0) -> jax.Array:
    """Per-example softmax cross-entropy against smoothed one-hot labels.

    Args:
      logits: [batch, classes], any float dtype (upcast to fp32 here).
      labels: [batch] integer class ids.
      label_smoothing: mass spread uniformly over all classes (0.1 in the large-batch recipe).

    Returns:
      [batch] fp32 losses.
    """
    logits = logits.astype(jnp.float32)
    num_classes = logits.shape[-1]
    targets = jax.nn.one_hot(labels, num_classes, dtype=jnp.float32)
    targets = targets * (1.0 - label_smoothing) + label_smoothing / num_classes
    # A class with target 0 adds nothing, even where its log-probability is -inf (a -inf logit):
    # 0 * -inf would be NaN.
    terms = jnp.where(targets > 0, targets * jax.nn.log_softmax(logits, axis=-1), 0.0)
    return -jnp.sum(terms, axis=-1)


def topk_correct(logits: jax.Array, labels: jax.Array, k: int) -> jax.Array:
    """Per-example 1.0 where the label is among the k largest logits, else 0.0 (fp32).

    Ties count in the label's favour; +-inf rank as usual. An example with a NaN anywhere in its
    logits scores 0: its ranking is undefined, and a diverged model must not look accurate.
    """
    logits = logits.astype(jnp.float32)
    label_logit = jnp.take_along_axis(logits, labels[:, None].astype(jnp.int32), axis=-1)
    # Rank = number of classes scoring strictly higher than the label. Every comparison with NaN
    # is False, so without the mask a NaN row would rank its label first.
    rank = jnp.sum(logits > label_logit, axis=-1)
    defined = ~jnp.any(jnp.isnan(logits), axis=-1)
    return ((rank < k) & defined).astype(jnp.float32)
