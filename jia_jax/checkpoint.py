"""Checkpoints of the training state: the trainer's saves, and its resume through them.

A checkpoint holds two items (`jia_jax.checkpoint_store`): ``state``, any pytree of (sharded or
replicated) `jax.Array`s (params, optimizer state, batch stats, loss scale, RNG key data, step),
and ``meta``, a JSON dict (the run's config and device count, step, seed). Saves are
asynchronous and atomic (orbax writes to a temporary directory and renames it when every process
has finished); the newest ``max_to_keep`` are kept. A save that cannot be written (disk full)
raises `CheckpointWriteError` and leaves the committed checkpoints as they were.

Typical use in the training loop::

  ckpt = Checkpointer(workdir / "checkpoints", max_to_keep=3, save_every_steps=1000)
  restored = ckpt.restore_latest(abstract_state)  # abstract_state: from jax.eval_shape
  with preemption.PreemptionHandler() as stop:
    for step in range(start, total_steps):
      # The step reduces every process's request (jia_jax/train.py, `stop_flags`).
      state, metrics = train_step(state, batch, stop_flags(mesh, stop.requested))
      ckpt.save(step, state, meta)  # no-op unless step % save_every_steps == 0
      if metrics["stop"] > 0:  # a process received a signal: every process sees it here
        ckpt.save(step, state, meta, force=True)
        break
  ckpt.close()  # waits for the last save

Restoring is `jia_jax.checkpoint_restore`: `restore_latest` sets unreadable checkpoints aside,
and `read_checkpoint` restores one checkpoint (the newest or a given step) and changes nothing
in the directory: what evaluation and export read (jia_jax/evaluate.py, jia_jax/export.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Self

import orbax.checkpoint as ocp
from absl import logging
from etils import epath

from jia_jax import checkpoint_restore
from jia_jax import checkpoint_store
from jia_jax import console

PyTree = Any

# Tensorstore errors embed their whole spec; the start says what failed, the end the OS's reason.
_MAX_ERROR_CHARS = 400


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written (disk full, directory not writable)."""


class Checkpointer:
    """Saves the training state and resumes from it, with an orbax `CheckpointManager`.

    All methods must be called by every process (orbax synchronises them); the directory must
    be shared by all processes.

    Args:
      directory: Where checkpoints live, one sub-directory per step.
      max_to_keep: How many of the newest checkpoints to keep.
      save_every_steps: `save` writes only at multiples of this (unless forced).
    """

    def __init__(
        self, directory: epath.PathLike, *, max_to_keep: int, save_every_steps: int
    ) -> None:
        # Checked before orbax creates the directory: 0 would divide by zero at the first save,
        # or (max_to_keep) silently keep no checkpoint at all.
        for field, value in (
            ("checkpoint_every_steps", save_every_steps),
            ("checkpoint_keep", max_to_keep),
        ):
            if value < 1:
                raise ValueError(f"{field}={value} must be >= 1.")
        self._directory = epath.Path(directory).absolute()
        self._save_every_steps = save_every_steps
        self._manager = checkpoint_store.open_manager(
            self._directory,
            max_to_keep=max_to_keep,
            save_every_steps=save_every_steps,
            read_only=False,
        )
        self._writing = _SaveInFlight(self._manager)

    @property
    def directory(self) -> epath.Path:
        """The checkpoint directory (absolute)."""
        return self._directory

    def all_steps(self) -> Sequence[int]:
        """Steps of the committed checkpoints, ascending."""
        return sorted(self._manager.all_steps())

    def should_save(self, step: int, *, force: bool = False) -> bool:
        """Whether `save(step, ..., force=force)` would write a checkpoint.

        Lets the caller do its checks before a save (e.g. that the state is finite) only at the
        steps that save.
        """
        if force:
            return step not in self._manager.all_steps()
        # Orbax would also save the first step of a run whatever the interval; we don't.
        return step % self._save_every_steps == 0

    def save(
        self, step: int, state: PyTree, meta: Mapping[str, Any], *, force: bool = False
    ) -> bool:
        """Starts an asynchronous save of `state` and `meta` at `step`.

        Returns once the arrays are copied off the devices, so `state` may be donated to the
        next step right away. Waits first for the previous save to finish.

        Args:
          step: Training step the state belongs to.
          state: Pytree of arrays.
          meta: JSON-serialisable dict.
          force: Save even if `step` is not a multiple of `save_every_steps` (for preemption
            and the final step).

        Returns:
          Whether a save was started (False off the save interval, or if `step` is saved already).

        Raises:
          CheckpointWriteError: This save or the previous one could not be written.
        """
        if not self.should_save(step, force=force):
            return False
        self.wait()
        args = ocp.args.Composite(
            **{
                checkpoint_store.STATE: ocp.args.StandardSave(state),
                checkpoint_store.META: ocp.args.JsonSave(dict(meta)),
            }
        )
        self._writing.step = step
        with self._writing.naming_errors():
            started = self._manager.save(step, args=args, force=force)
        self._writing.step = step if started else None
        return started

    def restore_latest(self, abstract_state: PyTree) -> tuple[int, PyTree, dict] | None:
        """Restores the newest readable checkpoint onto the shardings of `abstract_state`.

        An unreadable checkpoint (truncated or missing files) is moved to ``<directory>/corrupt/``
        (never deleted; the error is written into it), one warning line says so, and the previous
        one is tried.

        Args:
          abstract_state: Pytree of `jax.ShapeDtypeStruct` with shardings, e.g. from
            `jax.eval_shape` of the state initialiser plus the target shardings.

        Returns:
          ``(step, state, meta)``, or None if the directory holds no readable checkpoint.

        Raises:
          checkpoint_layout.CheckpointMismatchError: The newest readable checkpoint holds arrays
            of another structure, shape or dtype (another model or optimizer config).
          checkpoint_restore.NoReadableCheckpointError: There were checkpoints, and none could
            be read.
        """
        return checkpoint_restore.restore_newest(self._manager, abstract_state)

    def wait(self) -> None:
        """Blocks until the pending save is committed.

        Raises:
          CheckpointWriteError: The pending save could not be written.
        """
        with self._writing.naming_errors():
            self._manager.wait_until_finished()
        self._writing.step = None

    def close(self) -> None:
        """Waits for the pending save and releases orbax's resources."""
        with self._writing.naming_errors():
            self._manager.close()
        self._writing.step = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc_info: object) -> None:
        if exc_type is None:
            self.close()
            return
        # Already failing (perhaps on this very save): report that error, not a second one.
        try:
            self.close()
        except Exception as error:  # noqa: BLE001 (a consequence of the first error: logged only)
            logging.warning(
                "While stopping on an error, closing the checkpointer failed: %s", error
            )


class _SaveInFlight:
    """The step of the save being written (`step`, None when none is), named in a
    `CheckpointWriteError` if writing it fails: orbax reports a failed asynchronous save at the
    next call that waits for it."""

    def __init__(self, manager: ocp.CheckpointManager) -> None:
        self._manager = manager
        self.step: int | None = None

    @contextlib.contextmanager
    def naming_errors(self) -> Iterator[None]:
        """Turns a failure inside into a `CheckpointWriteError` naming `step` (if one is set)."""
        try:
            yield
        except Exception as error:
            step, self.step = self.step, None
            if step is None:
                raise
            # Orbax commits by renaming a finished save, and deletes old ones only after that.
            # Its step list already counts the failed save in and the oldest out: read the disk.
            self._manager.reload()
            kept = sorted(self._manager.all_steps())
            raise _write_error(epath.Path(self._manager.directory), step, error, kept) from error


def _write_error(
    directory: epath.Path, step: int, error: BaseException, kept: Sequence[int]
) -> CheckpointWriteError:
    """What a failed save of `step` tells the user: why, what is intact, how to resume."""
    resume = f"step {kept[-1]}" if kept else "step 0 (no checkpoint was committed)"
    why = console.one_line(console.error_text(error), _MAX_ERROR_CHARS)
    return CheckpointWriteError(
        f"Could not write the checkpoint of step {step} to {directory}: "
        f"{why}\nThe committed checkpoints {list(kept)} "
        "are intact. If the disk is full or the directory not writable, free space (or fix the "
        f"permissions) and rerun with the same --workdir to resume from {resume}."
    )
