"""LARS (layer-wise adaptive rate scaling) as optax transformations, computed in fp32.

Implements You et al. 2017, Algorithm 1, in the mixed-precision form of Jia et al. 2018: whatever
dtype the weights and gradients arrive in (fp32, bf16, fp16), norms, trust ratios and the momentum
buffer are fp32, and only the returned updates are cast back to each parameter's dtype. In fp16 the
per-layer learning rate and the squared norms leave fp16's range, which is why the paper moves LARS
to fp32.

References:
  You, Gitman, Ginsburg, "Large Batch Training of Convolutional Networks", 2017,
  https://arxiv.org/abs/1708.03888
  Jia et al., "Highly Scalable Deep Learning Training System with Mixed-Precision: Training
  ImageNet in Four Minutes", 2018, https://arxiv.org/abs/1807.11205
"""

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

# A pytree of Python bools (True = apply LARS and weight decay) shaped like the params, or a
# prefix of them, or a function of the params returning one.
MaskOrFn = Any | Callable[[optax.Params], Any]


class LarsState(NamedTuple):
    """State of `lars`.

    Attributes:
      count: int32 scalar, the number of updates taken; the learning-rate schedule's argument.
      momentum: fp32 buffer `v`, one leaf per parameter. It already includes the learning rate.
    """

    count: jax.Array
    momentum: optax.Updates


def exclude_bias_and_norm(params: optax.Params) -> Any:
    """Default LARS mask: True for conv/dense kernels, False for biases and norm scales/offsets.

    Jia et al. 2018 regularise only affine/conv weights; biases and BatchNorm parameters (the
    leaves with ndim <= 1) get plain momentum SGD without weight decay or trust ratio.

    Args:
      params: a pytree of arrays (or `jax.ShapeDtypeStruct`s).

    Returns:
      A pytree of Python bools with the structure of `params`.
    """
    return jax.tree.map(lambda p: jnp.ndim(p) > 1, params)


def _full_mask(mask: MaskOrFn, params: optax.Params) -> Any:
    """Resolves `mask` to a pytree of bools with exactly the structure of `params`."""
    mask_tree = mask(params) if callable(mask) else mask
    # A bool at an inner node of the mask (e.g. {"head": False}) covers that whole subtree.
    return jax.tree.map(lambda m, sub: jax.tree.map(lambda _: bool(m), sub), mask_tree, params)


def trust_ratio(
    w_norm: jax.Array,
    g_norm: jax.Array,
    weight_decay: float,
    trust_coefficient: float,
    eps: float = 0.0,
) -> jax.Array:
    """LARS' local learning rate `trust_coefficient * ||w|| / (||g|| + weight_decay * ||w|| +
    eps)` from the norms (any shape: one per leaf), 1 where a norm is 0.

    Shared by `lars` and code whose norms are summed over shards of the leaves.
    """
    ratio = trust_coefficient * w_norm / (g_norm + weight_decay * w_norm + eps)
    # A zero norm would give 0 (frozen layer) or 0/0; such leaves take the plain step instead.
    return jnp.where((w_norm == 0.0) | (g_norm == 0.0), 1.0, ratio)


def _lars_direction(
    grad: jax.Array,
    param: jax.Array,
    apply: bool,
    weight_decay: float,
    trust_coefficient: float,
    eps: float,
) -> jax.Array:
    """fp32 `local_lr * (g + wd * w)` for one leaf, or fp32 `g` where `apply` is False."""
    g = jnp.asarray(grad, jnp.float32)
    if not apply:
        return g
    w = jnp.asarray(param, jnp.float32)
    ratio = trust_ratio(
        jnp.linalg.norm(w), jnp.linalg.norm(g), weight_decay, trust_coefficient, eps
    )
    return ratio * (g + weight_decay * w)


def _directions(
    updates: optax.Updates,
    params: optax.Params | None,
    mask: MaskOrFn,
    weight_decay: float,
    trust_coefficient: float,
    eps: float,
) -> optax.Updates:
    """fp32 `_lars_direction` of every leaf."""
    if params is None:
        raise ValueError(
            "LARS needs the params (its trust ratio uses ||w||): call update(g, state, params)."
        )
    mask_tree = _full_mask(mask, params)
    return jax.tree.map(
        lambda g, w, m: _lars_direction(g, w, m, weight_decay, trust_coefficient, eps),
        updates,
        params,
        mask_tree,
    )


def _cast_like(tree: optax.Updates, params: optax.Params) -> optax.Updates:
    return jax.tree.map(lambda u, p: u.astype(jnp.result_type(p)), tree, params)


def scale_by_lars(
    weight_decay: float = 0.0,
    trust_coefficient: float = 0.001,
    mask: MaskOrFn = exclude_bias_and_norm,
    eps: float = 0.0,
) -> optax.GradientTransformation:
    """Rescales each gradient leaf by its LARS trust ratio, after adding weight decay.

    For each leaf where `mask` is True:
    `local_lr = trust_coefficient * ||w|| / (||g|| + weight_decay * ||w|| + eps)`
    (1 where `||w||` or `||g||` is 0) and the output is `local_lr * (g + weight_decay * w)`.
    Where `mask` is False the gradient passes through unchanged (no weight decay, no ratio).
    Computed in fp32; the output has each parameter's dtype. Stateless: chain it with
    `optax.scale_by_learning_rate` and `optax.trace` for a full optimizer, or use `lars`.

    Args:
      weight_decay: L2 coefficient `wd` (beta in You et al.).
      trust_coefficient: `eta` in You et al., about 0.001.
      mask: which leaves get LARS and weight decay; a pytree of bools like the params (or a
        prefix of them), or a function of the params returning one.
      eps: added to the ratio's denominator.

    Returns:
      An `optax.GradientTransformation` whose `update` requires `params`.

    Example:
      >>> import jax.numpy as jnp
      >>> tx = scale_by_lars(trust_coefficient=0.1)
      >>> params = {"w": jnp.full((2, 2), 3.0), "b": jnp.ones(2)}
      >>> grads = {"w": jnp.full((2, 2), 0.5), "b": jnp.ones(2)}
      >>> updates, _ = tx.update(grads, tx.init(params), params)
      >>> print(updates["w"][0, 0], updates["b"][0])  # 0.1 * 6 / 1 * 0.5, bias untouched
      0.3 1.0
    """

    def update_fn(updates, state, params=None):
        directions = _directions(updates, params, mask, weight_decay, trust_coefficient, eps)
        return _cast_like(directions, params), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update_fn)


def lars(
    learning_rate: optax.ScalarOrSchedule,
    weight_decay: float = 0.0,
    trust_coefficient: float = 0.001,
    momentum: float = 0.9,
    nesterov: bool = False,
    mask: MaskOrFn = exclude_bias_and_norm,
    eps: float = 0.0,
) -> optax.GradientTransformation:
    """LARS with momentum, You et al. 2017 Algorithm 1, in fp32 (Jia et al. 2018).

    Per leaf where `mask` is True, with `lr_t = learning_rate(t)`:
    `v <- momentum * v + lr_t * local_lr * (g + weight_decay * w)`, `w <- w - v`,
    `local_lr` as in `scale_by_lars`. Where `mask` is False, plain momentum SGD:
    `v <- momentum * v + lr_t * g`. With `nesterov`, the step is `momentum * v + lr_t * d` (d the
    term just added to `v`) instead of `v`. The learning rate sits inside the momentum buffer, so
    a change of `lr_t` affects only new contributions, as in the paper.

    Compared with `optax.lars(learning_rate, weight_decay, weight_decay_mask=m,
    trust_ratio_mask=m, trust_coefficient, eps, momentum, nesterov)` (optax 0.2.x): the learning
    rate is also applied before the momentum trace there, so the two agree when
    `weight_decay == 0`. They differ in the trust ratio's denominator: optax uses
    `||g + wd * w||` (the norm of the decayed update), this uses `||g|| + wd * ||w||`, the
    paper's formula, which is never smaller. optax also computes norms and the trace in the
    params' dtype; here they are fp32, so fp16 gradients whose squared norm overflows fp16 work.

    Args:
      learning_rate: global learning rate `lr_t`, a float or an optax schedule of the step count.
      weight_decay: L2 coefficient `wd` (beta in You et al.); masked-out leaves get none.
      trust_coefficient: `eta` in You et al., about 0.001.
      momentum: momentum `m`.
      nesterov: use Nesterov momentum.
      mask: which leaves get LARS and weight decay; a pytree of bools like the params (or a
        prefix of them), or a function of the params returning one.
      eps: added to the trust ratio's denominator.

    Returns:
      An `optax.GradientTransformation` with `LarsState`; `update` requires `params` and returns
      updates (to add with `optax.apply_updates`) in each parameter's dtype.

    Example:
      >>> import jax, jax.numpy as jnp, optax
      >>> tx = lars(learning_rate=optax.linear_schedule(0.0, 1.0, 10), weight_decay=1e-4)
      >>> params = {"w": jnp.ones((3, 3)), "b": jnp.zeros(3)}
      >>> state = tx.init(params)
      >>> loss = lambda p: jnp.sum((p["w"] @ jnp.ones(3) + p["b"] - 1.0) ** 2)
      >>> for _ in range(3):
      ...     updates, state = tx.update(jax.grad(loss)(params), state, params)
      ...     params = optax.apply_updates(params, updates)
      >>> print(int(state.count), state.momentum["w"].dtype)
      3 float32
    """

    def init_fn(params):
        return LarsState(
            count=jnp.zeros([], jnp.int32),
            momentum=jax.tree.map(lambda p: jnp.zeros(jnp.shape(p), jnp.float32), params),
        )

    def update_fn(updates, state, params=None):
        directions = _directions(updates, params, mask, weight_decay, trust_coefficient, eps)
        lr = learning_rate(state.count) if callable(learning_rate) else learning_rate
        lr = jnp.asarray(lr, jnp.float32)
        added = jax.tree.map(lambda d: lr * d, directions)
        new_v = jax.tree.map(lambda a, v: momentum * v + a, added, state.momentum)
        steps = jax.tree.map(lambda a, v: momentum * v + a, added, new_v) if nesterov else new_v
        neg_steps = jax.tree.map(jnp.negative, steps)
        new_state = LarsState(count=optax.safe_increment(state.count), momentum=new_v)
        return _cast_like(neg_steps, params), new_state

    return optax.GradientTransformation(init_fn, update_fn)
