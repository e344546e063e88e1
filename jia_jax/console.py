"""What reaches the console from the libraries: our progress and errors, not their internals."""

import contextlib
import logging
import os
import types
from collections.abc import Iterator

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
