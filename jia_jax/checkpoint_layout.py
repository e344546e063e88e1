"""Whether a checkpoint holds the arrays of the state to restore, and what to tell the user if not.

A checkpoint restores only onto a state of the same arrays: names, shapes and dtypes (another
model, optimizer or precision setting changes them). The check reads the checkpoint's metadata
alone, so a mismatch is named array by array before any data is read, and it is a
`CheckpointMismatchError` (a wrong config, the checkpoint is fine), not an unreadable checkpoint.
The target state must also say where each array goes (a sharding per leaf).

One difference is read, not refused: convolution kernels (and their momentum) in the (h, w, in,
out) order that checkpoints written before `jia_jax.models.conv` hold. `check_layout` names them,
`restore_target` reads them in that shape and `from_old_layout` transposes them to the model's
(out, h, w, in). The decision reads only the metadata, so every process makes the same one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.sharding import NamedSharding, PartitionSpec

from jia_jax import checkpoint_store
from jia_jax.models import conv

PyTree = Any
# Per array name (dot-separated key path): its shape and dtype.
Shapes = Mapping[str, tuple[tuple[int, ...], np.dtype]]

# How many differences a mismatch error lists before summarising the rest.
_MAX_LISTED_DIFFERENCES = 10


class CheckpointMismatchError(ValueError):
    """The checkpoint's arrays do not match the state the trainer expects to restore."""


class _UnreadableCheckpointError(RuntimeError):
    """A checkpoint's metadata could not be read."""


def check_layout(
    manager: ocp.CheckpointManager, step: int, abstract_state: PyTree
) -> frozenset[str]:
    """The names of the arrays stored as old-layout conv kernels (`old_layout_kernels`), read
    from metadata only.

    Raises:
      CheckpointMismatchError: Anything else differs; it lists the arrays that differ.
    """
    metadata = manager.metadata(step).item_metadata[checkpoint_store.STATE]
    if metadata is None:
        raise _UnreadableCheckpointError(f"no readable array metadata for step {step}")
    # Older orbax versions return the tree itself, newer ones wrap it.
    stored = _flat_shapes(getattr(metadata, "tree", metadata))
    # Flattened by key path, named as orbax names the stored arrays. (Not via serialize_tree:
    # it fails on sequences that hold a leafless node first, e.g. optax's EmptyState.)
    expected = _flat_shapes(abstract_state)
    old = old_layout_kernels(stored, expected)
    differences = _describe_differences(_without(stored, old), _without(expected, old))
    if differences:
        if old:  # not listed: they alone would not stop the restore
            differences.append(
                f"({len(old)} more differ only as conv kernels stored in the old (h, w, in, out) "
                "order, which is read)"
            )
        raise CheckpointMismatchError(
            f"The checkpoint at step {step} in {manager.directory} does not match the training "
            "state of this config (another model, optimizer or precision setting?):\n  "
            + "\n  ".join(differences)
            + "\nTo start a new run with this config, use a new --workdir. To resume this run, "
            "use the config it was saved with (stored in the checkpoint's meta/metadata file)."
        )
    return old


def old_layout_kernels(stored: Shapes, expected: Shapes) -> frozenset[str]:
    """The arrays of both whose stored shape is the expected 4-D shape in (h, w, in, out) order
    (`conv.flax_order`), dtypes equal: conv kernels or their momentum saved before the models
    stored kernels (out, h, w, in).

    A kernel of shape (k, k, k, k) reads the same in both orders and is never named.
    """
    return frozenset(
        name
        for name in stored.keys() & expected.keys()
        if len(expected[name][0]) == 4
        and stored[name] != expected[name]
        and stored[name] == (conv.flax_order(expected[name][0]), expected[name][1])
    )


def restore_target(abstract_state: PyTree, old: frozenset[str]) -> PyTree:
    """`abstract_state` with each leaf named in `old` in the shape it is stored in, placed so
    that `from_old_layout` transposes each shard where it lies."""

    def target(name: str, leaf: jax.ShapeDtypeStruct) -> jax.ShapeDtypeStruct:
        if name not in old:
            return leaf
        shape, sharding = conv.flax_order(tuple(leaf.shape)), leaf.sharding
        return jax.ShapeDtypeStruct(shape, leaf.dtype, sharding=_flax_kernel_sharding(sharding))

    return _map_named(target, abstract_state)


def from_old_layout(state: PyTree, old: frozenset[str], abstract_state: PyTree) -> PyTree:
    """`state` (restored onto `restore_target`) with the leaves named in `old` transposed by
    `conv.from_flax_kernel` to `abstract_state`'s shapes and shardings (exact: a permutation).
    A collective over processes: every process must call it with the same `old`."""
    if not old:
        return state
    names = _leaf_names(state)
    leaves = jax.tree.leaves(state)
    targets = jax.tree.leaves(abstract_state)
    picked = [i for i, name in enumerate(names) if name in old]
    transpose = jax.jit(
        lambda kernels: [conv.from_flax_kernel(k) for k in kernels],
        out_shardings=[targets[i].sharding for i in picked],
    )
    for i, kernel in zip(picked, transpose([leaves[i] for i in picked])):
        leaves[i] = kernel
    return jax.tree.unflatten(jax.tree.structure(state), leaves)


def check_has_shardings(abstract_state: PyTree) -> None:
    """Raises `ValueError` naming the leaves of `abstract_state` that have no target sharding."""
    missing = [
        jax.tree_util.keystr(path)
        for path, leaf in jax.tree_util.tree_leaves_with_path(abstract_state)
        if getattr(leaf, "sharding", None) is None
    ]
    if missing:
        raise ValueError(
            "Restoring a checkpoint needs a target sharding for every leaf, e.g. "
            "jax.ShapeDtypeStruct(shape, dtype, sharding=...); missing for: " + ", ".join(missing)
        )


def _flat_shapes(tree: PyTree) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    return {
        ".".join(path): (tuple(leaf.shape), np.dtype(leaf.dtype))
        for path, leaf in ocp.tree.to_flat_dict(tree).items()
    }


def _leaf_names(tree: PyTree) -> list[str]:
    """The `_flat_shapes` name of each leaf of `tree`, in `jax.tree.leaves` order (orbax flattens
    with `jax.tree_util.tree_flatten_with_path`, so the orders agree)."""
    return [".".join(path) for path in ocp.tree.to_flat_dict(tree)]


def _map_named(fn: Callable[[str, Any], Any], tree: PyTree) -> PyTree:
    """`tree` with each leaf replaced by ``fn(its _flat_shapes name, leaf)``."""
    leaves = [fn(name, leaf) for name, leaf in zip(_leaf_names(tree), jax.tree.leaves(tree))]
    return jax.tree.unflatten(jax.tree.structure(tree), leaves)


def _flax_kernel_sharding(sharding: jax.sharding.Sharding) -> jax.sharding.Sharding:
    """Where an (out, h, w, in) kernel's `sharding` puts each element, for the kernel stored
    (h, w, in, out): a `NamedSharding`'s spec permuted as the axes are (so a partitioned axis
    stays divisible); any other sharding (replicated, one device) as it is."""
    if not isinstance(sharding, NamedSharding):
        return sharding
    spec = (*sharding.spec, *(None,) * (4 - len(sharding.spec)))
    return NamedSharding(sharding.mesh, PartitionSpec(*conv.flax_order(spec)))


def _without(shapes: Shapes, names: frozenset[str]) -> Shapes:
    return {name: shape for name, shape in shapes.items() if name not in names}


def _describe_differences(stored: Shapes, expected: Shapes) -> list[str]:
    def fmt(shape_dtype: tuple[tuple[int, ...], np.dtype]) -> str:
        return f"{shape_dtype[1].name}{list(shape_dtype[0])}"

    differences = [
        f"{name}: in the state {fmt(expected[name])}, not in the checkpoint"
        for name in sorted(expected.keys() - stored.keys())
    ]
    differences += [
        f"{name}: in the checkpoint {fmt(stored[name])}, not in the state"
        for name in sorted(stored.keys() - expected.keys())
    ]
    differences += [
        f"{name}: checkpoint {fmt(stored[name])}, state {fmt(expected[name])}"
        for name in sorted(stored.keys() & expected.keys())
        if stored[name] != expected[name]
    ]
    if len(differences) > _MAX_LISTED_DIFFERENCES:
        rest = len(differences) - _MAX_LISTED_DIFFERENCES
        differences = differences[:_MAX_LISTED_DIFFERENCES] + [f"... and {rest} more"]
    return differences
