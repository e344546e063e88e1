"""Whether a checkpoint holds the arrays of the state to restore, and what to tell the user if not.

A checkpoint restores only onto a state of the same arrays: names, shapes and dtypes (another
model, optimizer or precision setting changes them). The check reads the checkpoint's metadata
alone, so a mismatch is named array by array before any data is read, and it is a
`CheckpointMismatchError` (a wrong config, the checkpoint is fine), not an unreadable checkpoint.
The target state must also say where each array goes (a sharding per leaf).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from jia_jax import checkpoint_store

PyTree = Any
# Per array name (dot-separated key path): its shape and dtype.
Shapes = Mapping[str, tuple[tuple[int, ...], np.dtype]]

# How many differences a mismatch error lists before summarising the rest.
_MAX_LISTED_DIFFERENCES = 10


class CheckpointMismatchError(ValueError):
    """The checkpoint's arrays do not match the state the trainer expects to restore."""


class _UnreadableCheckpointError(RuntimeError):
    """A checkpoint's metadata could not be read."""


def check_layout(manager: ocp.CheckpointManager, step: int, abstract_state: PyTree) -> None:
    """Raises `CheckpointMismatchError` listing the arrays that differ (read from metadata only)."""
    metadata = manager.metadata(step).item_metadata[checkpoint_store.STATE]
    if metadata is None:
        raise _UnreadableCheckpointError(f"no readable array metadata for step {step}")
    # Older orbax versions return the tree itself, newer ones wrap it.
    stored = _flat_shapes(getattr(metadata, "tree", metadata))
    # Flattened by key path, named as orbax names the stored arrays. (Not via serialize_tree:
    # it fails on sequences that hold a leafless node first, e.g. optax's EmptyState.)
    expected = _flat_shapes(abstract_state)
    differences = _describe_differences(stored, expected)
    if differences:
        raise CheckpointMismatchError(
            f"The checkpoint at step {step} in {manager.directory} does not match the training "
            "state of this config (another model, optimizer or precision setting?):\n  "
            + "\n  ".join(differences)
            + "\nTo start a new run with this config, use a new --workdir. To resume this run, "
            "use the config it was saved with (stored in the checkpoint's meta/metadata file)."
        )


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
