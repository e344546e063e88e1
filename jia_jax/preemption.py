"""A stop signal (SIGTERM from a scheduler, Ctrl-C) turned into "save a checkpoint and stop".

A preempted job gets SIGTERM and some seconds before SIGKILL: enough to save the current step
rather than lose everything since the last scheduled checkpoint. `PreemptionHandler` only
records the request; the training loop (jia_jax/loop.py) acts on it at a step boundary, where
every process agrees to stop (`jia_jax.train.stop_flags`) and the state is consistent.
"""

from __future__ import annotations

import signal
import types
from collections.abc import Sequence
from typing import Any, Self

from absl import logging


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
