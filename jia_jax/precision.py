"""Compute-dtype policy and dynamic loss scaling for fp16 training.

Params and optimizer state stay fp32; the forward and backward passes run in the compute dtype.
fp16 gradients underflow unless the loss is scaled up first (Micikevicius et al. 2018,
https://arxiv.org/abs/1710.03740), so with fp16 the scale adapts: it grows by `factor` after
`growth_interval` finite steps in a row and shrinks by `factor` (never below `minimum`) on a step
whose gradients hold an inf or NaN, which is then skipped. bf16 and fp32 need no scaling; with
`dynamic=False` the same functions keep a constant scale of 1, so the trainer has one code path:

    grads = unscale(mean_grads, ls)
    finite = all_finite(grads)
    new_params, new_opt = ...LARS update...
    params, opt = select_tree(finite, (new_params, new_opt), (params, opt))
    ls = update_loss_scale(ls, finite, growth_interval=..., factor=..., minimum=..., dynamic=...)

All of it is pure and jit-friendly. Call it on gradients already averaged over devices, so every
device takes the same skip/grow decision.
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jia_jax import bucketing
from jia_jax import comm_model
from jia_jax import fp8_wire

_COMPUTE_DTYPES = {"bfloat16": jnp.bfloat16, "float16": jnp.float16, "float32": jnp.float32}


def compute_dtype(name: str) -> jnp.dtype:
    """The dtype named by `precision.compute`: 'bfloat16', 'float16' or 'float32'.

    Raises:
      ValueError: for any other name.
    """
    if name not in _COMPUTE_DTYPES:
        raise ValueError(
            f"precision.compute must be one of {sorted(_COMPUTE_DTYPES)}, got {name!r}"
        )
    return jnp.dtype(_COMPUTE_DTYPES[name])


def needs_loss_scaling(dtype: jnp.dtype) -> bool:
    """True for fp16, whose narrow exponent range makes small gradients underflow."""
    return jnp.dtype(dtype) == jnp.float16


def check_wire_dtype(wire: str, compute: jnp.dtype, strategy: str) -> None:
    """Refuses a `comm.dtype` the all-reduce does not send, an fp16 all-reduce without fp16
    compute's loss scaling, and an fp8 one left to XLA (`comm.strategy='xla'`).

    Unscaled gradients, divided by the device count before the cast, fall below fp16's smallest
    subnormal (6e-8) and arrive as zeros; bf16 has fp32's range in the same two bytes. fp8 is
    scaled per chunk (jia_jax/fp8_wire.py), whatever the compute dtype.

    Raises:
      ValueError: naming the field to change.
    """
    if wire not in comm_model.WIRE_ITEMSIZE:
        raise ValueError(f"comm.dtype={wire!r} must be one of {tuple(comm_model.WIRE_ITEMSIZE)}.")
    if wire == "float16" and not needs_loss_scaling(compute):
        raise ValueError(
            f"comm.dtype='float16' needs precision.compute='float16' (its loss scaling keeps small "
            f"gradients above fp16's underflow); with {jnp.dtype(compute).name} compute use "
            "comm.dtype='bfloat16' (the same bytes) or 'float32'."
        )
    if bucketing.is_fp8_wire(wire) and strategy == "xla":
        raise ValueError(fp8_wire.NOT_BY_XLA)


class LossScaleState(NamedTuple):
    """Loss-scaling state, replicated on every device and checkpointed with the params.

    Attributes:
      scale: fp32 scalar the loss is multiplied by.
      good_steps: int32 scalar, finite steps since the scale last changed or overflowed.
    """

    scale: jax.Array
    good_steps: jax.Array


def check_loss_scale(cfg: Any) -> None:
    """Raises a ValueError naming the `precision.loss_scale` field (a ConfigDict or a mapping)
    whose value keeps the dynamic scale from working: a scale that never moves (factor 1) or
    starts or ends at 0."""
    limits = {"initial": (0.0, "> 0"), "minimum": (0.0, "> 0"), "factor": (1.0, "> 1"),
              "growth_interval": (0, ">= 1")}
    for field, (bound, says) in limits.items():
        if cfg[field] <= bound:
            raise ValueError(f"precision.loss_scale.{field}={cfg[field]} must be {says}.")


def init_loss_scale(initial: float = 2.0**15, *, dynamic: bool = True) -> LossScaleState:
    """Initial state: scale `initial` if `dynamic`, else 1 (a no-op for bf16/fp32)."""
    return LossScaleState(
        scale=jnp.asarray(initial if dynamic else 1.0, jnp.float32),
        good_steps=jnp.zeros([], jnp.int32),
    )


def scale_loss(loss: jax.Array, state: LossScaleState) -> jax.Array:
    """The loss times the scale; differentiate this one."""
    return loss * state.scale


def unscale(grads: Any, state: LossScaleState) -> Any:
    """Gradients of the scaled loss divided by the scale, in fp32 whatever their dtype."""
    return jax.tree.map(lambda g: jnp.asarray(g, jnp.float32) / state.scale, grads)


def all_finite(tree: Any) -> jax.Array:
    """bool scalar: no leaf of `tree` holds an inf or NaN (True for an empty tree).

    A float leaf of rank 2 or more is judged by its fp32 L2 norm: with LARS, the very
    `jnp.linalg.norm` it takes of each kernel's gradient (`jia_jax.lars`), which XLA then computes
    once for both, so the check adds no pass over the kernels' gradients (with another optimizer,
    a reduction a kernel, as a per-element check would). The squares' sum is inf or NaN when an
    element is; it also overflows when the norm exceeds 1.8e19 (fp32's largest value's root),
    far above any fp16 gradient over a scale of 1 or more; such a leaf reads as not finite, so the
    step is skipped, never a bad one taken. The float leaves of rank 0 or 1 (biases, norm scales)
    are joined and checked in one reduction.
    """
    leaves = [jnp.asarray(x) for x in jax.tree.leaves(tree)]
    floats = [x for x in leaves if jnp.issubdtype(x.dtype, jnp.floating)]
    checks = [
        jnp.isfinite(jnp.linalg.norm(jnp.asarray(x, jnp.float32))) for x in floats if x.ndim > 1
    ]
    small = [jnp.ravel(jnp.asarray(x, jnp.float32)) for x in floats if x.ndim <= 1]
    if small:
        checks.append(jnp.all(jnp.isfinite(jnp.concatenate(small))))
    # Complex leaves (no model here has them) element by element: the fp32 cast drops the imag.
    checks += [jnp.all(jnp.isfinite(x)) for x in leaves if jnp.iscomplexobj(x)]
    return jnp.all(jnp.stack(checks)) if checks else jnp.array(True)


def update_loss_scale(
    state: LossScaleState,
    finite: jax.Array,
    *,
    growth_interval: int,
    factor: float,
    minimum: float,
    dynamic: bool = True,
) -> LossScaleState:
    """The next loss-scale state after a step whose gradients were `finite` or not.

    Not finite: scale / factor (at least `minimum`), good_steps 0. Finite: good_steps + 1; when
    it reaches `growth_interval`, scale * factor and good_steps 0. With `dynamic=False` the state
    is returned unchanged.

    Args:
      state: the current state.
      finite: bool scalar, e.g. `all_finite(unscaled_grads)`.
      growth_interval: finite steps in a row before the scale grows.
      factor: growth and shrink factor (> 1).
      minimum: floor of the scale.
      dynamic: False for a constant scale (bf16/fp32).

    Returns:
      The new `LossScaleState`.
    """
    if not dynamic:
        return state
    good_steps = jnp.where(finite, state.good_steps + 1, 0)
    grow = good_steps >= growth_interval
    scale = jnp.where(
        finite,
        jnp.where(grow, state.scale * factor, state.scale),
        jnp.maximum(state.scale / factor, minimum),
    )
    return LossScaleState(
        scale=scale.astype(jnp.float32),
        good_steps=jnp.where(grow, 0, good_steps).astype(jnp.int32),
    )


def select_tree(pred: jax.Array, new: Any, old: Any) -> Any:
    """`new` where the bool scalar `pred` holds, else `old`, leaf by leaf (skips a bad step)."""
    return jax.tree.map(lambda n, o: jnp.where(pred, n, o), new, old)


def select_joined(pred: jax.Array, new: Any, old: Any) -> Any:
    """`select_tree` for many small leaves (BatchNorm's statistics): the leaves of each dtype
    joined into one vector, selected at once and split again, so XLA runs one kernel for them,
    not one a leaf or a layer (they are made in forward, far from the update's own kernels).

    Raises:
      ValueError: an `old` leaf's shape or dtype differs from its `new` leaf's (a select would
        promote or broadcast it; the skipped step would not keep it bit for bit).
    """
    new_leaves, treedef = jax.tree.flatten(new)
    old_leaves = treedef.flatten_up_to(old)
    for n, o in zip(new_leaves, old_leaves, strict=True):
        if (n.shape, n.dtype) != (o.shape, o.dtype):
            raise ValueError(
                f"select_joined: an old leaf of {o.dtype}{list(o.shape)} against a new one of "
                f"{n.dtype}{list(n.shape)}; the two trees must match leaf for leaf."
            )
    out: list[Any] = list(new_leaves)
    # First-seen order, not a set's: every process must trace the same program.
    for dtype in dict.fromkeys(x.dtype for x in new_leaves):
        at = [i for i, x in enumerate(new_leaves) if x.dtype == dtype]
        joined = jnp.where(
            pred,
            jnp.concatenate([jnp.ravel(new_leaves[i]) for i in at]),
            jnp.concatenate([jnp.ravel(old_leaves[i]) for i in at]),
        )
        ends = np.cumsum([new_leaves[i].size for i in at])
        for i, part in zip(at, jnp.split(joined, ends[:-1]), strict=True):
            out[i] = part.reshape(new_leaves[i].shape)
    return treedef.unflatten(out)
