"""The order in which a model's parameters are used: the order backward makes their gradients.

JAX flattens dicts by sorted key, so `tree_leaves(params)` puts `classifier` before `stem_conv` and
`block10` before `block2`. Tensor fusion wants buckets that fill in the order backward produces
gradients (last layer first), so we record the forward call order of the submodules instead.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp


def backward_leaf_order(model: nn.Module, input_shape: tuple[int, ...]) -> tuple[int, ...]:
    """Indices into `jax.tree_util.tree_leaves(params)`, in the order backward produces them.

    Submodules are ranked by their first call during an abstract `model.init` on one example of
    `input_shape` (no FLOPs are spent); the leaves of later-called modules come first. Leaves of one
    module keep their flattened order.
    """
    calls: list[tuple[str, ...]] = []

    def record(next_fun, args, kwargs, context):
        if context.method_name == "__call__" and context.module.path not in calls:
            calls.append(context.module.path)
        return next_fun(*args, **kwargs)

    with nn.intercept_methods(record):
        variables = jax.eval_shape(
            lambda: model.init(jax.random.key(0), jnp.zeros((1, *input_shape)), train=False)
        )
    paths = [
        tuple(k.key for k in path)
        for path, _ in jax.tree_util.tree_flatten_with_path(variables["params"])[0]
    ]
    rank = {module: i for i, module in enumerate(calls)}
    forward = sorted(range(len(paths)), key=lambda i: (rank[paths[i][:-1]], i))
    return tuple(reversed(forward))
