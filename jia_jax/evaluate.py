"""A trained checkpoint evaluated on its own: `python -m jia_jax.main --mode=eval`.

Restores the newest checkpoint of a workdir (or that of `--step`) onto the config's mesh and
runs the trainer's eval step over the whole eval split, each example once: the top-1 it prints
is the one the run printed for that step. Nothing in the workdir changes, so a run can be
evaluated while it trains.
"""

from __future__ import annotations

import dataclasses
import os

import jax
import ml_collections
from absl import logging

from jia_jax import checkpoint_restore
from jia_jax import loop
from jia_jax import train


@dataclasses.dataclass(frozen=True)
class Restored:
    """A checkpoint of a run, restored: the state and what was built to read it."""

    trainer: loop.Trainer
    step: int
    state: train.TrainState


def checkpoint_dir(workdir: str) -> str:
    """Where the trainer keeps the checkpoints of `workdir`."""
    return os.path.join(os.path.abspath(workdir), "checkpoints")


def restore(
    config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh, workdir: str, step: int | None
) -> Restored:
    """The checkpoint of `step` (None: the newest) of `workdir`, restored onto `mesh`.

    Raises:
      FileNotFoundError: no checkpoint (of `step`) in `workdir`.
      checkpoint_layout.CheckpointMismatchError: it holds another model than `config`'s.
      checkpoint_restore.NoReadableCheckpointError: it cannot be read.
    """
    trainer = loop.build_trainer(config, mesh)
    step, state, _ = checkpoint_restore.read_checkpoint(
        checkpoint_dir(workdir), trainer.abstract_state, step
    )
    return Restored(trainer, step, state)


def evaluate_checkpoint(
    config: ml_collections.ConfigDict, workdir: str, step: int | None = None
) -> dict[str, float]:
    """Evaluates the checkpoint of `step` (None: the newest) of `workdir` on the eval split.

    Returns:
      ``eval/{top1,top5,loss,examples}`` and ``step``, also logged in one line.

    Raises:
      ValueError: the dataset has no eval split (`synthetic`).
    """
    peers, mesh = loop.connect(config)
    with peers.reporting(checkpoint_dir(workdir)):
        restored = restore(config, mesh, workdir, step)
        data = restored.trainer.data
        if data.eval is None:
            raise ValueError(f"data.name={config.data.name!r} has no eval split to evaluate on.")
        eval_step = train.make_eval_step(restored.trainer.model, config, mesh)
        results = loop.evaluate(eval_step, restored.state, data)
    logging.info(
        "eval of the checkpoint of step %d in %s: top-1 %.4f, top-5 %.4f, loss %.4f over %d "
        "examples",
        restored.step,
        checkpoint_dir(workdir),
        results["eval/top1"],
        results["eval/top5"],
        results["eval/loss"],
        results["eval/examples"],
    )
    return {**results, "step": restored.step}
