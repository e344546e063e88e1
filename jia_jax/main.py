"""Command line: `python -m jia_jax.main --config=configs/digits.py --workdir=/tmp/run`.

Any config field can be overridden with `--config.a.b=value`.
"""

import logging as std_logging

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from jia_jax import loop

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Path to an ml_collections config file.", lock_config=True
)
_WORKDIR = flags.DEFINE_string(
    "workdir",
    None,
    "Directory for checkpoints and TensorBoard logs; a run given the "
    "same workdir resumes from its latest checkpoint.",
)
flags.mark_flags_as_required(["config", "workdir"])


def _hide_library_info(record: std_logging.LogRecord) -> bool:
    # Orbax logs every save step by step at INFO; keep the console to our progress and warnings.
    return record.levelno >= std_logging.WARNING or "/orbax/" not in record.pathname


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    logging.get_absl_handler().addFilter(_hide_library_info)
    loop.train_and_evaluate(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
    app.run(main)
