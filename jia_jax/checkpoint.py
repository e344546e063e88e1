"""Checkpoints of the training state and preemption handling.

A checkpoint holds two items: ``state``, any pytree of (sharded or replicated) `jax.Array`s
(params, optimizer state, batch stats, loss scale, RNG key data, step), and ``meta``, a JSON dict
(the run's config and device count, step, seed). Saves are asynchronous and atomic (orbax writes
to a temporary directory and renames it when every process has finished); the newest
``max_to_keep`` are kept. A save that cannot be written (disk full) raises
`CheckpointWriteError` and leaves the committed checkpoints as they were.

Typical use in the training loop::

  ckpt = Checkpointer(workdir / "checkpoints", max_to_keep=3, save_every_steps=1000)
  restored = ckpt.restore_latest(abstract_state)  # abstract_state: from jax.eval_shape
  with PreemptionHandler() as preemption:
    for step in range(start, total_steps):
      # The step reduces every process's request (jia_jax/train.py, `stop_flags`).
      state, metrics = train_step(state, batch, stop_flags(mesh, preemption.requested))
      ckpt.save(step, state, meta)  # no-op unless step % save_every_steps == 0
      if metrics["stop"] > 0:  # a process received a signal: every process sees it here
        ckpt.save(step, state, meta, force=True)
        break
  ckpt.close()  # waits for the last save
"""

from __future__ import annotations

import contextlib
import signal
import sys
import types
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Self

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath
from jax.sharding import Mesh, NamedSharding, PartitionSpec

PyTree = Any

_STATE = "state"
_META = "meta"
# Sub-directory that receives checkpoints found unreadable, so they are kept for inspection but
# no longer shadow the step numbers the resumed run will save again.
_CORRUPT_DIR = "corrupt"
# How many differences a mismatch error lists before summarising the rest.
_MAX_LISTED_DIFFERENCES = 10
# Tensorstore errors embed their whole spec; the start says what failed, the end the OS's reason.
_MAX_ERROR_CHARS = 400


class CheckpointMismatchError(ValueError):
    """The checkpoint's arrays do not match the state the trainer expects to restore."""


class NoReadableCheckpointError(RuntimeError):
    """Every checkpoint in the directory failed to load."""


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written (disk full, directory not writable)."""


class _UnreadableCheckpointError(RuntimeError):
    """A checkpoint's metadata could not be read."""


class Checkpointer:
    """Saves and restores the training state with an orbax `CheckpointManager`.

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
        self._manager = ocp.CheckpointManager(
            self._directory,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=max_to_keep,
                save_interval_steps=save_every_steps,
                enable_async_checkpointing=True,
                # Left-over temporary directories are saves that never committed.
                cleanup_tmp_directories=True,
            ),
            item_handlers={
                _STATE: ocp.StandardCheckpointHandler(),
                _META: ocp.JsonCheckpointHandler(),
            },
        )
        # The step of the save still being written, named if writing it fails.
        self._writing: int | None = None

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
            **{_STATE: ocp.args.StandardSave(state), _META: ocp.args.JsonSave(dict(meta))}
        )
        self._writing = step
        with self._naming_write_errors():
            started = self._manager.save(step, args=args, force=force)
        self._writing = step if started else None
        return started

    def restore_latest(self, abstract_state: PyTree) -> tuple[int, PyTree, dict] | None:
        """Restores the newest readable checkpoint onto the shardings of `abstract_state`.

        An unreadable checkpoint (truncated or missing files) is logged as a warning, moved to
        ``<directory>/corrupt/`` (never deleted) and the previous one is tried.

        Args:
          abstract_state: Pytree of `jax.ShapeDtypeStruct` with shardings, e.g. from
            `jax.eval_shape` of the state initialiser plus the target shardings.

        Returns:
          ``(step, state, meta)``, or None if the directory holds no readable checkpoint.

        Raises:
          CheckpointMismatchError: The newest readable checkpoint holds arrays of another
            structure, shape or dtype (another model or optimizer config).
          NoReadableCheckpointError: There were checkpoints, and none could be read.
        """
        _check_has_shardings(abstract_state)
        moved = []  # one "step N (why) -> where" per unreadable checkpoint, newest first
        for step in sorted(self._manager.all_steps(), reverse=True):
            restored, reason = _try_restore(self._manager, step, abstract_state)
            # Every process must resume from the same step, even if only one failed to read.
            if not any_process(reason is not None):
                if moved:
                    logging.warning(
                        "Unreadable checkpoint %s; resuming from the checkpoint of step %d.",
                        "; ".join(moved),
                        step,
                    )
                return step, restored[_STATE], dict(restored[_META])
            reason = reason or "it failed to load on another process"
            moved.append(f"of step {step} ({reason}) moved to {_quarantine(self._manager, step)}")
        if moved:
            # Starting over silently would throw a run away, e.g. on a bug in our restore path.
            raise NoReadableCheckpointError(
                f"No checkpoint in {self._directory} could be read: {'; '.join(moved)}. Rerun "
                "to start from step 0 in this workdir, or use a new --workdir."
            )
        return None

    def wait(self) -> None:
        """Blocks until the pending save is committed.

        Raises:
          CheckpointWriteError: The pending save could not be written.
        """
        with self._naming_write_errors():
            self._manager.wait_until_finished()
        self._writing = None

    def close(self) -> None:
        """Waits for the pending save and releases orbax's resources."""
        with self._naming_write_errors():
            self._manager.close()
        self._writing = None

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

    @contextlib.contextmanager
    def _naming_write_errors(self) -> Iterator[None]:
        """Turns a failure to write the save of `self._writing` into a `CheckpointWriteError`."""
        try:
            yield
        except Exception as error:
            step, self._writing = self._writing, None
            if step is None:
                raise
            # Orbax commits by renaming a finished save, and deletes old ones only after that.
            # Its step list already counts the failed save in and the oldest out: read the disk.
            self._manager.reload()
            kept = self.all_steps()
            resume = f"step {kept[-1]}" if kept else "step 0 (no checkpoint was committed)"
            raise CheckpointWriteError(
                f"Could not write the checkpoint of step {step} to {self._directory}: "
                f"{_error_summary(error)}\nThe committed checkpoints {kept} are intact. If the "
                "disk is full or the directory not writable, free space (or fix the permissions) "
                f"and rerun with the same --workdir to resume from {resume}."
            ) from error


def _error_summary(error: BaseException) -> str:
    # One line: TensorStore errors carry a multi-line spec of the array.
    text = " ".join(str(error).split())
    if len(text) > _MAX_ERROR_CHARS:
        half = _MAX_ERROR_CHARS // 2
        text = f"{text[:half]} ... {text[-half:]}"
    return f"{type(error).__name__}: {text}"


# Restore with fallback: each step is read on its own; one that fails is set aside.


def _try_restore(
    manager: ocp.CheckpointManager, step: int, abstract_state: PyTree
) -> tuple[Mapping[str, Any] | None, str | None]:
    """``(restored, None)``, or ``(None, why)`` if the checkpoint of `step` cannot be read.

    Raises:
      CheckpointMismatchError: It is readable but holds another state (not a damaged file).
    """
    # Before the read: a failed read's aftermath can reach the console before `except` runs.
    _drop_closed_loop_callbacks()
    try:
        _check_layout(manager, step, abstract_state)
        restored = manager.restore(
            step,
            args=ocp.args.Composite(
                **{_STATE: ocp.args.StandardRestore(abstract_state), _META: ocp.args.JsonRestore()}
            ),
        )
    except CheckpointMismatchError:
        raise
    except Exception as error:  # noqa: BLE001 (any read failure makes it "unreadable")
        return None, _error_summary(error)
    return restored, None


def _drop_closed_loop_callbacks() -> None:
    """Keeps the aftermath of a failed read off the console (the warning says what happened).

    When one read of a restore fails, orbax closes its event loop while TensorStore still
    completes the other reads on its own threads; each hands its result to the closed loop, and
    Python reports the `RuntimeError('Event loop is closed')` that `call_soon_threadsafe` raises
    there as unraisable, a traceback per array, sometimes before the failure has reached the
    caller. Those, and only those, are dropped from the first restore on (a successful restore
    raises none).
    """
    if getattr(sys.unraisablehook, "drops_closed_loop_callbacks", False):
        return
    previous = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        error = unraisable.exc_value
        frames = {frame.f_code.co_name for frame in _frames(unraisable.exc_traceback)}
        closed_loop = isinstance(error, RuntimeError) and str(error) == "Event loop is closed"
        if not (closed_loop and "call_soon_threadsafe" in frames):
            previous(unraisable)

    hook.drops_closed_loop_callbacks = True
    sys.unraisablehook = hook


def _frames(tb: types.TracebackType | None) -> Iterator[types.FrameType]:
    while tb is not None:
        yield tb.tb_frame
        tb = tb.tb_next


def _quarantine(manager: ocp.CheckpointManager, step: int) -> epath.Path:
    """Moves the checkpoint of `step` to ``corrupt/`` (kept for inspection, out of the way of the
    resumed run's own save of that step) and returns where. A collective over processes."""
    directory = epath.Path(manager.directory)
    corrupt_dir = directory / _CORRUPT_DIR
    destination = corrupt_dir / str(step)
    copy = 1
    while destination.exists():
        destination = corrupt_dir / f"{step}_{copy}"
        copy += 1
    if jax.process_index() == 0:
        corrupt_dir.mkdir(parents=True, exist_ok=True)
        (directory / str(step)).rename(destination)
    ocp.multihost.sync_global_processes(f"jia_jax_checkpoint_quarantine_{step}")
    manager.reload()
    return destination


# Array layout: the checkpoint must hold the arrays (names, shapes, dtypes) of the state.


def _check_layout(manager: ocp.CheckpointManager, step: int, abstract_state: PyTree) -> None:
    """Raises `CheckpointMismatchError` listing the arrays that differ (read from metadata only)."""
    metadata = manager.metadata(step).item_metadata[_STATE]
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


def _check_has_shardings(abstract_state: PyTree) -> None:
    missing = [
        jax.tree_util.keystr(path)
        for path, leaf in jax.tree_util.tree_leaves_with_path(abstract_state)
        if getattr(leaf, "sharding", None) is None
    ]
    if missing:
        raise ValueError(
            "restore_latest needs a target sharding for every leaf, e.g. "
            "jax.ShapeDtypeStruct(shape, dtype, sharding=...); missing for: " + ", ".join(missing)
        )


def _flat_shapes(tree: PyTree) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    return {
        ".".join(path): (tuple(leaf.shape), np.dtype(leaf.dtype))
        for path, leaf in ocp.tree.to_flat_dict(tree).items()
    }


def _describe_differences(
    stored: Mapping[str, tuple[tuple[int, ...], np.dtype]],
    expected: Mapping[str, tuple[tuple[int, ...], np.dtype]],
) -> list[str]:
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


class PreemptionHandler:
    """Turns SIGTERM/SIGINT into a request to save a checkpoint and stop.

    The first signal of each kind only sets a flag; the handler that was installed before is
    then put back, so a second Ctrl-C (or SIGTERM) acts as usual. Create it in the main thread
    (Python delivers signals there). The training loop hands `requested` to every step, whose
    metrics then tell every process that some process asked (`jia_jax.train.make_train_step`),
    and on that saves with ``force=True``, waits and exits with status 0.

    Args:
      signals: The signals to catch.
    """

    def __init__(self, signals: Sequence[int] = (signal.SIGTERM, signal.SIGINT)) -> None:
        self._requested = False
        self._previous = {sig: signal.signal(sig, self._handle) for sig in signals}

    @property
    def requested(self) -> bool:
        """Whether this process received a stop signal."""
        return self._requested

    def close(self) -> None:
        """Puts back the signal handlers that were installed before."""
        for sig in list(self._previous):
            signal.signal(sig, self._pop_previous(sig))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _handle(self, signum: int, frame: types.FrameType | None) -> None:
        del frame
        self._requested = True
        signal.signal(signum, self._pop_previous(signum))
        logging.warning(
            "Received %s: will save a checkpoint and stop; send it again to stop at once.",
            signal.Signals(signum).name,
        )

    def _pop_previous(self, sig: int) -> Any:
        previous = self._previous.pop(sig)
        # None means the previous handler was not installed from Python.
        return signal.SIG_DFL if previous is None else previous
