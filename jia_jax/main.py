"""Command line: `python -m jia_jax.main --config=configs/digits.py --workdir=/tmp/run`.

Any config field can be overridden with `--config.a.b=value`. A mistake a user can fix (a bad
flag or config value, a path, a dataset not prepared, a damaged checkpoint, a diverged run) ends
the run with one line naming it and exit status 1; `--traceback` shows where it was raised.
"""

import os
import re
import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from jia_jax import bad_records
from jia_jax import checkpoint
from jia_jax import console
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
_TRACEBACK = flags.DEFINE_bool(
    "traceback",
    False,
    "On an error, print its full traceback instead of the one line naming the mistake.",
)
flags.mark_flags_as_required(["config", "workdir"])

# What a user's mistake raises (validation of config values, paths, data and checkpoints all
# raise these, naming the field or file and what to do). Anything else is a bug: traceback.
USER_ERRORS = (
    ValueError,
    OSError,
    FloatingPointError,
    bad_records.CorruptDatasetError,
    checkpoint.NoReadableCheckpointError,
    checkpoint.CheckpointWriteError,
)
def _flag_error(error: BaseException, argv: list[str]) -> str:
    """One line for a config file that does not load or an override of a field it lacks."""
    if isinstance(error, OSError):
        # ml_collections re-raises "Failed loading config file ... Attempted [paths] ... why";
        # the last line is why (a missing file; an exception inside it is a flags.Error).
        why = str(error.__cause__ or error).strip().splitlines()[-1].strip()
        return f"--config: cannot load the config file: {why}"
    # KeyError("'optimizr'\nDid you mean ...") or AttributeError(KeyError("'width'")).
    lines = str(error.args[0]).strip("\"'").split("\n")
    key = lines[0].strip("\"'")
    overrides = [a for a in argv if re.match(rf"--config\.(\w+\.)*{re.escape(key)}\b", a)]
    named = overrides[0] if overrides else "a --config.* override"
    hint = " ".join(lines[1:]) or "An override can only set a field the config file defines."
    return f"{named}: the config has no field {key!r}. {hint}"


def parse_flags(argv: list[str]) -> list[str]:
    """absl's flag parsing; a config override or file that cannot apply is one line too."""
    try:
        args = app.parse_flags_with_usage(argv)
        _CONFIG.value.get("seed")  # ml_collections defers a config file's load error to first use
    except (KeyError, AttributeError, OSError) as error:
        if "--traceback" in argv:
            raise
        sys.exit(f"FATAL Flags parsing error: {_flag_error(error, argv)}")
    return args


def check_workdir(workdir: str) -> None:
    """Raises `NotADirectoryError` if `workdir` exists and is not a directory."""
    if os.path.exists(workdir) and not os.path.isdir(workdir):
        raise NotADirectoryError(
            f"--workdir={workdir} is a file; give a directory (it is created if missing)."
        )


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        sys.exit(
            f"FATAL Flags parsing error: unexpected arguments {argv[1:]}; flags are written "
            "--name=value (no spaces around '=')."
        )
    logging.get_absl_handler().addFilter(console.hide_library_info)
    try:
        check_workdir(_WORKDIR.value)
        loop.train_and_evaluate(_CONFIG.value, _WORKDIR.value)
    except USER_ERRORS as error:
        if _TRACEBACK.value:
            raise
        sys.exit(f"{type(error).__name__}: {error}")


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
