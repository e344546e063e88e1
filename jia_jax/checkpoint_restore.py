"""Reading checkpoints back: the trainer's resume, and a read-only read for evaluation and export.

`restore_newest` (behind `Checkpointer.restore_latest`) resumes a run from its newest readable
checkpoint. A checkpoint that cannot be read (truncated or missing files) is moved to
``<dir>/corrupt/`` with the error written into it, never deleted, and the one before it is
tried: a damaged save costs the steps since the previous one, not the run. A readable checkpoint
of another state is a wrong config, not damage: it raises
`jia_jax.checkpoint_layout.CheckpointMismatchError` and stays where it is.

`read_checkpoint` reads one checkpoint (the newest or a given step) and changes nothing in the
directory, so a run may be evaluated while it trains (jia_jax/evaluate.py, jia_jax/export.py).

Every process calls these together; they agree through `any_process`, so all resume from the
same step even if only one process failed to read a checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jia_jax import checkpoint_layout
from jia_jax import checkpoint_store
from jia_jax import console

PyTree = Any

# Sub-directory that receives checkpoints found unreadable, so they are kept for inspection but
# no longer shadow the step numbers the resumed run will save again.
_CORRUPT_DIR = "corrupt"
# Written into a checkpoint moved to `_CORRUPT_DIR` by each process that failed to read it: the
# whole error, which the console line leaves out (TensorStore's spans hundreds of characters).
_WHY_FILE = "unreadable_process_{}.txt"
# A read error in a one-line message about a checkpoint left where it is.
_MAX_REASON_CHARS = 160


class NoReadableCheckpointError(RuntimeError):
    """Every checkpoint in the directory failed to load (or the one asked for did)."""


def read_checkpoint(
    directory: epath.PathLike, abstract_state: PyTree, step: int | None = None
) -> tuple[int, PyTree, dict]:
    """The checkpoint of `step` (None: the newest) restored onto `abstract_state`'s shardings.

    Changes nothing in `directory`: an unreadable checkpoint stays where it is and a save in
    progress is left alone, so a run may be evaluated while it trains. Every process must call
    it.

    Raises:
      FileNotFoundError: `directory` holds no checkpoint, or none of `step`.
      CheckpointMismatchError: The checkpoint holds another state (another model or optimizer).
      NoReadableCheckpointError: The checkpoint cannot be read.
    """
    checkpoint_layout.check_has_shardings(abstract_state)
    directory = epath.Path(directory).absolute()
    steps = sorted(int(p.name) for p in directory.glob("*") if p.name.isdigit())
    if not steps:
        raise FileNotFoundError(
            f"No checkpoint in {directory}: --workdir must be the workdir of a training run "
            "that has saved one."
        )
    if step is None:
        step = steps[-1]
    elif step not in steps:
        raise FileNotFoundError(
            f"--step={step}: {directory} holds no checkpoint of that step; it holds steps {steps}."
        )
    with console.without_logs_from(ocp):  # a read-only manager warns that it is read-only
        manager = checkpoint_store.open_manager(directory, read_only=True)
    try:
        restored, reason = _try_restore(manager, step, abstract_state)
        failed = any_process(reason is not None)
    finally:
        manager.close()
    if failed:
        why = console.one_line(
            reason or "it failed to load on another process", _MAX_REASON_CHARS
        )
        others = [s for s in steps if s != step]
        raise NoReadableCheckpointError(
            f"The checkpoint of step {step} in {directory} cannot be read ({why}); "
            + (f"--step= one of {others} reads another." if others else "it is the only one.")
        )
    return step, restored[checkpoint_store.STATE], dict(restored[checkpoint_store.META])


def restore_newest(
    manager: ocp.CheckpointManager, abstract_state: PyTree
) -> tuple[int, PyTree, dict] | None:
    """`Checkpointer.restore_latest`: the newest readable checkpoint, unreadable ones set aside."""
    checkpoint_layout.check_has_shardings(abstract_state)
    moved = []  # (step, where it went) per unreadable checkpoint, newest first
    for step in sorted(manager.all_steps(), reverse=True):
        restored, reason = _try_restore(manager, step, abstract_state)
        # Every process must resume from the same step, even if only one failed to read.
        if not any_process(reason is not None):
            if moved:
                logging.warning(
                    "%s; resuming from the checkpoint of step %d.", _moved_aside(moved), step
                )
            return step, restored[checkpoint_store.STATE], dict(restored[checkpoint_store.META])
        moved.append((step, _quarantine(manager, step, reason)))
    if moved:
        # Starting over silently would throw a run away, e.g. on a bug in our restore path.
        raise NoReadableCheckpointError(
            f"No checkpoint in {manager.directory} could be read. {_moved_aside(moved)}. Rerun "
            "to start from step 0 in this --workdir, or use a new --workdir."
        )
    return None


def _moved_aside(moved: Sequence[tuple[int, epath.Path]]) -> str:
    where = ", ".join(f"step {step} to {path}" for step, path in moved)
    return f"Moved the unreadable checkpoint of {where} (why: {_WHY_FILE.format('*')} in it)"


def _try_restore(
    manager: ocp.CheckpointManager, step: int, abstract_state: PyTree
) -> tuple[Mapping[str, Any] | None, str | None]:
    """``(restored, None)``, or ``(None, the error)`` if the checkpoint of `step` cannot be read
    (``(None, None)`` where only another process's metadata failed to load).

    The processes agree on the layout check before any reads the arrays: a process that skipped
    the read (its view of the files differs) would leave the others waiting for it. Conv kernels
    stored in the old (h, w, in, out) order are read in it and transposed (`checkpoint_layout`).

    Raises:
      CheckpointMismatchError: It is readable but holds another state (not a damaged file), on
        this process or another.
    """
    # Before the read: a failed read's aftermath can reach the console before `except` runs.
    console.drop_closed_loop_callbacks()
    mismatch, unreadable, old = _checked_layout(manager, step, abstract_state)
    if any_process(mismatch is not None):
        raise mismatch or checkpoint_layout.CheckpointMismatchError(
            f"The checkpoint at step {step} in {manager.directory} does not match the training "
            "state of this config on another process (its error says how)."
        )
    if any_process(unreadable is not None):
        return None, unreadable  # None here: another process's read failed (the caller agrees)
    target = checkpoint_layout.restore_target(abstract_state, old)
    try:
        restored = _restore(manager, step, target)
    except Exception as error:  # noqa: BLE001 (any read failure makes it "unreadable")
        return None, console.error_text(error)
    if old:
        restored = _from_old_layout(restored, step, old, abstract_state)
    return restored, None


def _from_old_layout(
    restored: Mapping[str, Any], step: int, old: frozenset[str], abstract_state: PyTree
) -> Mapping[str, Any]:
    """`restored` with the conv kernels named in `old` (read in the old (h, w, in, out) order)
    transposed to `abstract_state`'s; says so in one line. A collective over processes."""
    logging.info(
        "Converted %d arrays of the checkpoint of step %d from the old (h, w, in, out) conv "
        "kernel layout to (out, h, w, in).",
        len(old),
        step,
    )
    state = checkpoint_layout.from_old_layout(restored[checkpoint_store.STATE], old, abstract_state)
    return {**restored, checkpoint_store.STATE: state}


def _restore(manager: ocp.CheckpointManager, step: int, target: PyTree) -> Mapping[str, Any]:
    """The state (onto `target`) and metadata of the checkpoint of `step`."""
    # On a damaged checkpoint orbax logs its internals ("Metadata file does not exist",
    # "provide a `CheckpointHandlerRegistry`"): the caller's one line says what happened.
    with console.without_logs_from(ocp):
        return manager.restore(
            step,
            args=ocp.args.Composite(
                **{
                    checkpoint_store.STATE: ocp.args.StandardRestore(target),
                    checkpoint_store.META: ocp.args.JsonRestore(),
                }
            ),
        )


def _checked_layout(
    manager: ocp.CheckpointManager, step: int, abstract_state: PyTree
) -> tuple[checkpoint_layout.CheckpointMismatchError | None, str | None, frozenset[str]]:
    """This process's layout check of `step`: (the mismatch, None, {}), (None, why the metadata
    is unreadable, {}) or (None, None, the arrays stored as old-layout conv kernels)."""
    try:
        with console.without_logs_from(ocp):
            old = checkpoint_layout.check_layout(manager, step, abstract_state)
    except checkpoint_layout.CheckpointMismatchError as error:
        return error, None, frozenset()
    except Exception as error:  # noqa: BLE001 (any read failure makes it "unreadable")
        return None, console.error_text(error), frozenset()
    return None, None, old


def _quarantine(manager: ocp.CheckpointManager, step: int, reason: str | None) -> epath.Path:
    """Moves the checkpoint of `step` to ``corrupt/`` (kept for inspection, out of the way of the
    resumed run's own save of that step), writes `reason` into it (if this process has one) and
    returns where. A collective over processes."""
    directory = epath.Path(manager.directory)
    corrupt_dir = directory / _CORRUPT_DIR
    destination = corrupt_dir / str(step)
    copy = 1
    while destination.exists():
        destination = corrupt_dir / f"{step}_{copy}"
        copy += 1
    # Every process has chosen the same destination before it exists.
    ocp.multihost.sync_global_processes(f"jia_jax_checkpoint_quarantine_chosen_{step}")
    if jax.process_index() == 0:
        corrupt_dir.mkdir(parents=True, exist_ok=True)
        (directory / str(step)).rename(destination)
    ocp.multihost.sync_global_processes(f"jia_jax_checkpoint_quarantine_{step}")
    if reason is not None:
        (destination / _WHY_FILE.format(jax.process_index())).write_text(reason + "\n")
    manager.reload()
    return destination


def any_process(flag: bool) -> bool:
    """Returns True on every process if `flag` is True on at least one.

    A collective over all devices: every process must call it at the same point of the program.
    """
    if jax.process_count() == 1:
        return flag
    mesh = Mesh(np.array(jax.devices()), ("processes",))
    shards = [jax.device_put(np.full((1,), flag, np.int32), d) for d in jax.local_devices()]
    flags = jax.make_array_from_single_device_arrays(
        (jax.device_count(),), NamedSharding(mesh, PartitionSpec("processes")), shards
    )
    replicated = NamedSharding(mesh, PartitionSpec())
    return bool(jax.jit(jnp.max, out_shardings=replicated)(flags))
