"""How a run's checkpoints are stored: the orbax `CheckpointManager` that writes and reads them.

One sub-directory per step holds two items: `STATE`, any pytree of (sharded or replicated)
`jax.Array`s written by orbax's standard handler, and `META`, a JSON dict. The trainer's writer
(`jia_jax.checkpoint`) and the readers (`jia_jax.checkpoint_restore`) open the directory through
`open_manager`, so they agree on that layout.
"""

from __future__ import annotations

import orbax.checkpoint as ocp
from etils import epath

STATE = "state"
META = "meta"


def open_manager(
    directory: epath.Path, *, max_to_keep: int = 1, save_every_steps: int = 1, read_only: bool
) -> ocp.CheckpointManager:
    """An orbax manager of the two items; a `read_only` one creates, cleans and deletes nothing."""
    return ocp.CheckpointManager(
        directory,
        options=ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep,
            save_interval_steps=save_every_steps,
            enable_async_checkpointing=not read_only,
            # Left-over temporary directories are saves that never committed; a reader leaves
            # them alone (they may be the save a running trainer is writing).
            cleanup_tmp_directories=not read_only,
            create=not read_only,
            read_only=read_only,
        ),
        item_handlers={
            STATE: ocp.StandardCheckpointHandler(),
            META: ocp.JsonCheckpointHandler(),
        },
    )
