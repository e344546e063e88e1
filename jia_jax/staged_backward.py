"""Backward in parts, so that each part's gradient all-reduce starts while the parts below run.

Horovod and PyTorch DDP overlap the gradient all-reduce with backward by sending each bucket as
soon as backward has produced its gradients. In one XLA program nothing says *when* a bucket is
ready: XLA's scheduler starts an asynchronous all-reduce as soon as its operand exists, but its
memory-minimising order computes the weight gradients and packs the buckets late (on ResNet-50,
the first bucket was packed after 100 of the 158 convolutions, docs/benchmarks.md), so most of
the wire time fell after backward.

Here the model runs as parts (`ResNet`/`AlexNetBN` run any range of their segments, with the
variables they have in the whole net), each differentiated with `jax.vjp`; backward then runs
part by part from the top. Once a part's parameter gradients exist they are packed into their
wire buckets, and those buckets pass one `optimization_barrier` together with the cotangent that
enters the part below (`allreduce.send`'s `tie`): the part below cannot start its backward
before the buckets above are packed, so their all-reduce can start there, under the rest of
backward. The values are those of one `jax.grad` of the whole net.

`comm.backward_cuts` names the segment boundaries where backward is cut (`ResNet.backward_cuts`,
(3, 4), cuts after stage 2 and after stage 3: 1.4M, 7.1M and 17.0M of ResNet-50's parameters
from the bottom). Off by default: its first version, whose collectives read the barrier's
outputs, ran slower across hosts than backward in one piece (docs/benchmarks.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jia_jax import loss as loss_lib
from jia_jax import normalize

# send(part index, the part's parameter gradients, the cotangent to tie or None)
#   -> (what was sent, the cotangent)
Send = Callable[[int, Any, Any], tuple[Any, Any]]


@dataclasses.dataclass(frozen=True)
class Parts:
    """A model cut into parts: segment bounds and the top-level variable names of each part."""

    bounds: tuple[int, ...]  # 0, *cuts, num_segments
    names: tuple[frozenset[str], ...]  # per part, bottom first

    def split(self, tree: dict[str, Any]) -> list[dict[str, Any]]:
        """`tree` (params or batch_stats) as one dict per part; a part may have none."""
        return [{k: v for k, v in tree.items() if k in names} for names in self.names]


def model_parts(model: nn.Module, input_shape: tuple[int, ...], cuts: Sequence[int]) -> Parts:
    """`model` cut at segment boundaries `cuts` (`comm.backward_cuts`), found abstractly.

    Raises:
      ValueError: `cuts` are not increasing segment boundaries strictly inside the model, or
        the model cannot run a range of segments (no `num_segments`).
    """
    segments = getattr(model, "num_segments", None)
    if segments is None:
        raise ValueError(
            f"comm.backward_cuts={tuple(cuts)} needs a model that runs ranges of its segments "
            f"(ResNet, AlexNetBN); {type(model).__name__} does not: set comm.backward_cuts=()."
        )
    bounds = (0, *cuts, segments)
    if any(a >= b for a, b in zip(bounds, bounds[1:])):
        raise ValueError(
            f"comm.backward_cuts={tuple(cuts)} must increase strictly between 0 and {segments} "
            f"(this model's segments); () runs backward in one piece."
        )
    names = []
    x = jax.ShapeDtypeStruct((1, *input_shape), jnp.float32)
    for start, stop in zip(bounds, bounds[1:]):
        x, variables = jax.eval_shape(
            lambda h, a=start, b=stop: model.init_with_output(
                jax.random.key(0), h, train=False, start=a, stop=b
            ),
            x,
        )
        names.append(frozenset(variables.get("params", {})) | set(variables.get("batch_stats", {})))
    return Parts(bounds, tuple(names))


def part_leaf_order(
    params: dict[str, Any], order: Sequence[int], names: frozenset[str]
) -> tuple[int, ...]:
    """`order` (indices into `tree_leaves(params)`, `call_order.backward_leaf_order`) restricted
    to the leaves under `names`, as indices into the leaves of that part's dict."""
    paths = jax.tree_util.tree_flatten_with_path(params)[0]
    # A dict of some of the keys flattens to the same leaves, in the same (sorted-key) order.
    mine = [i for i, (path, _) in enumerate(paths) if path[0].key in names]
    position = {leaf: k for k, leaf in enumerate(mine)}
    return tuple(position[i] for i in order if i in position)


def staged_grads(model: nn.Module, compute: jnp.dtype, smoothing: float, parts: Parts) -> Callable:
    """`(low_params, batch_stats, scale, batch, key, send) -> (sent, new_stats, metrics)`.

    As `train.local_grads_fn`, but backward runs part by part from the top, and each part's
    parameter gradients go to `send(index, grads, tie)` as soon as they exist (`tie`: the
    cotangent of the part below, None for the bottom part); `sent` lists what `send` returned,
    bottom part first.
    """

    def grads(low_params, batch_stats, scale, batch, key, send: Send):
        params, stats = parts.split(low_params), parts.split(batch_stats)
        spans = list(zip(parts.bounds, parts.bounds[1:]))

        def apply(i, p, h):
            out, new = model.apply(
                {"params": p, "batch_stats": stats[i]},
                h,
                train=True,
                start=spans[i][0],
                stop=spans[i][1],
                mutable=["batch_stats"],
                rngs={"dropout": key},
            )
            return out, new["batch_stats"]

        image = normalize.model_input(batch["image"], compute)
        # The bottom part is differentiated for its parameters only: the images need no gradient.
        h, bottom_vjp, bottom_stats = jax.vjp(lambda p: apply(0, p, image), params[0], has_aux=True)
        vjps, new_stats = [bottom_vjp], [bottom_stats]
        for i in range(1, len(spans) - 1):
            h, vjp, part_stats = jax.vjp(
                lambda p, x, i=i: apply(i, p, x), params[i], h, has_aux=True
            )
            vjps.append(vjp)
            new_stats.append(part_stats)

        def top(p, x):
            logits, part_stats = apply(len(spans) - 1, p, x)
            loss = loss_lib.batch_loss(logits, batch["label"], smoothing)
            return loss * scale, (loss, logits, part_stats)

        scaled, top_vjp, (loss, logits, top_stats) = jax.vjp(top, params[-1], h, has_aux=True)
        vjps.append(top_vjp)
        new_stats.append(top_stats)

        cotangent = jnp.ones_like(scaled)
        sent = [None] * len(spans)
        for i in reversed(range(len(spans))):
            if i == 0:
                (g,) = vjps[0](cotangent)
                sent[0], _ = send(0, g, None)
            else:
                g, cotangent = vjps[i](cotangent)
                sent[i], cotangent = send(i, g, cotangent)
        metrics = loss_lib.train_metrics(loss, logits, batch["label"])
        return sent, {k: v for part in new_stats for k, v in part.items()}, metrics

    return grads
