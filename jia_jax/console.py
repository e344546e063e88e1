"""What reaches the console from the libraries: our progress and errors, not their internals."""

import contextlib
import logging
import os
import sys
import types
from collections.abc import Iterator
from typing import Any

# absl.logging's logger: JAX, orbax and tfds log through it, as we do.
_ABSL = "absl"
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def hide_library_info(record: logging.LogRecord) -> bool:
    """A log filter: keeps our INFO lines and everyone's warnings.

    Libraries log at INFO what a user need not read (orbax every save step by step, JAX the TPU
    backend it did not find).
    """
    return record.levelno >= logging.WARNING or record.pathname.startswith(_PACKAGE_DIR)


@contextlib.contextmanager
def without_logs_from(package: types.ModuleType) -> Iterator[None]:
    """Drops the log lines of `package` (from any thread) while the block runs.

    For a library call whose failure we report in one line of our own: orbax restoring a
    damaged checkpoint logs its internals from several threads, tfds warns about the folders of
    a dataset that is not prepared.
    """
    where = os.path.dirname(package.__file__)

    def outside(record: logging.LogRecord) -> bool:
        return not record.pathname.startswith(where)

    logger = logging.getLogger(_ABSL)
    logger.addFilter(outside)
    try:
        yield
    finally:
        logger.removeFilter(outside)


def error_text(error: BaseException) -> str:
    """`error` as its type's name and its message, e.g. ``ValueError: bad value``."""
    return f"{type(error).__name__}: {error}"


def one_line(text: str, limit: int) -> str:
    """`text` on one line (TensorStore errors carry a multi-line spec of the array), its start
    and end kept if it is longer than `limit`."""
    text = " ".join(text.split())
    if len(text) > limit:
        half = limit // 2
        text = f"{text[:half]} ... {text[-half:]}"
    return text


def drop_closed_loop_callbacks() -> None:
    """Keeps the aftermath of a failed checkpoint read off the console (our line says what
    happened).

    When one read of an orbax restore fails, orbax closes its event loop while TensorStore still
    completes the other reads on its own threads; each hands its result to the closed loop, and
    Python reports the `RuntimeError('Event loop is closed')` that `call_soon_threadsafe` raises
    there as unraisable, a traceback per array, sometimes before the failure has reached the
    caller. The reads' tasks and futures that failed too are reported by asyncio ("Task (or
    Future) exception was never retrieved", with the TensorStore spec of the array) whenever the
    garbage collector frees them, which may be well after the restore. Those, and only those,
    are dropped from the first call on (a successful restore raises none); call it before each
    restore.
    """
    if getattr(sys.unraisablehook, "drops_closed_loop_callbacks", False):
        return
    logging.getLogger("asyncio").addFilter(_not_a_failed_read_task)
    previous = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        error = unraisable.exc_value
        frames = {frame.f_code.co_name for frame in _frames(unraisable.exc_traceback)}
        closed_loop = isinstance(error, RuntimeError) and str(error) == "Event loop is closed"
        if not (closed_loop and "call_soon_threadsafe" in frames):
            previous(unraisable)

    hook.drops_closed_loop_callbacks = True
    sys.unraisablehook = hook


def _not_a_failed_read_task(record: logging.LogRecord) -> bool:
    """False for asyncio's report of a task or future whose TensorStore read failed unretrieved."""
    error = record.exc_info[1] if record.exc_info else None
    unretrieved = record.getMessage().startswith(
        ("Task exception was never retrieved", "Future exception was never retrieved")
    )
    return not (unretrieved and "tensorstore_spec" in str(error))


def _frames(tb: types.TracebackType | None) -> Iterator[types.FrameType]:
    while tb is not None:
        yield tb.tb_frame
        tb = tb.tb_next
