"""Checkpoints of the training state, and preemption handling.

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

`read_checkpoint` restores one checkpoint (the newest or a given step) and changes nothing in the
directory: what evaluation and export read (jia_jax/evaluate.py, jia_jax/export.py).
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

from jia_jax import console

PyTree = Any

_STATE = "state"
_META = "meta"
# Sub-directory that receives checkpoints found unreadable, so they are kept for inspection but
# no longer shadow the step numbers the resumed run will save again.
_CORRUPT_DIR = "corrupt"
# Written into a checkpoint moved to `_CORRUPT_DIR` by each process that failed to read it: the
# whole error, which the console line leaves out (TensorStore's spans hundreds of characters).
_WHY_FILE = "unreadable_process_{}.txt"
# How many differences a mismatch error lists before summarising the rest.
_MAX_LISTED_DIFFERENCES = 10
# Tensorstore errors embed their whole spec; the start says what failed, the end the OS's reason.
_MAX_ERROR_CHARS = 400
# A read error in a one-line message about a checkpoint left where it is.
_MAX_REASON_CHARS = 160


class CheckpointMismatchError(ValueError):
    """The checkpoint's arrays do not match the state the trainer expects to restore."""


class NoReadableCheckpointError(RuntimeError):
    """Every checkpoint in the directory failed to load (or the one asked for did)."""


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written (disk full, directory not writable)."""


class _UnreadableCheckpointError(RuntimeError):
    """A checkpoint's metadata could not be read."""


def _manager(
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
            _STATE: ocp.StandardCheckpointHandler(),
            _META: ocp.JsonCheckpointHandler(),
        },
    )


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
        self._manager = _manager(
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
            **{_STATE: ocp.args.StandardSave(state), _META: ocp.args.JsonSave(dict(meta))}
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
          CheckpointMismatchError: The newest readable checkpoint holds arrays of another
            structure, shape or dtype (another model or optimizer config).
          NoReadableCheckpointError: There were checkpoints, and none could be read.
        """
        return _restore_newest(self._manager, abstract_state)

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
    return CheckpointWriteError(
        f"Could not write the checkpoint of step {step} to {directory}: "
        f"{_summary(_error_text(error), _MAX_ERROR_CHARS)}\nThe committed checkpoints {list(kept)} "
        "are intact. If the disk is full or the directory not writable, free space (or fix the "
        f"permissions) and rerun with the same --workdir to resume from {resume}."
    )


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
    _check_has_shardings(abstract_state)
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
        manager = _manager(directory, read_only=True)
    try:
        restored, reason = _try_restore(manager, step, abstract_state)
        failed = any_process(reason is not None)
    finally:
        manager.close()
    if failed:
        why = _summary(reason or "it failed to load on another process", _MAX_REASON_CHARS)
        others = [s for s in steps if s != step]
        raise NoReadableCheckpointError(
            f"The checkpoint of step {step} in {directory} cannot be read ({why}); "
            + (f"--step= one of {others} reads another." if others else "it is the only one.")
        )
    return step, restored[_STATE], dict(restored[_META])


def _error_text(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def _summary(text: str, limit: int) -> str:
    """`text` on one line (TensorStore errors carry a multi-line spec of the array), its start
    and end kept if it is longer than `limit`."""
    text = " ".join(text.split())
    if len(text) > limit:
        half = limit // 2
        text = f"{text[:half]} ... {text[-half:]}"
    return text


# Restore with fallback: each step is read on its own; one that fails is set aside.


def _restore_newest(
    manager: ocp.CheckpointManager, abstract_state: PyTree
) -> tuple[int, PyTree, dict] | None:
    """`Checkpointer.restore_latest`: the newest readable checkpoint, unreadable ones set aside."""
    _check_has_shardings(abstract_state)
    moved = []  # (step, where it went) per unreadable checkpoint, newest first
    for step in sorted(manager.all_steps(), reverse=True):
        restored, reason = _try_restore(manager, step, abstract_state)
        # Every process must resume from the same step, even if only one failed to read.
        if not any_process(reason is not None):
            if moved:
                logging.warning(
                    "%s; resuming from the checkpoint of step %d.", _moved_aside(moved), step
                )
            return step, restored[_STATE], dict(restored[_META])
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
    """``(restored, None)``, or ``(None, the error)`` if the checkpoint of `step` cannot be read.

    Raises:
      CheckpointMismatchError: It is readable but holds another state (not a damaged file).
    """
    # Before the read: a failed read's aftermath can reach the console before `except` runs.
    _drop_closed_loop_callbacks()
    try:
        # On a damaged checkpoint orbax logs its internals ("Metadata file does not exist",
        # "provide a `CheckpointHandlerRegistry`"): the caller's one line says what happened.
        with console.without_logs_from(ocp):
            _check_layout(manager, step, abstract_state)
            restored = manager.restore(
                step,
                args=ocp.args.Composite(
                    **{
                        _STATE: ocp.args.StandardRestore(abstract_state),
                        _META: ocp.args.JsonRestore(),
                    }
                ),
            )
    except CheckpointMismatchError:
        raise
    except Exception as error:  # noqa: BLE001 (any read failure makes it "unreadable")
        return None, _error_text(error)
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
