"""Command line: `python -m jia_jax.main --config=configs/digits.py --workdir=/tmp/run`.

Trains by default; `--mode=eval` evaluates a checkpoint of the workdir and `--mode=export`
writes one to a single file (jia_jax/evaluate.py, jia_jax/export.py).

Any config field can be overridden with `--config.a.b=value`. A mistake a user can fix (a bad
flag or config value, a path, a dataset not prepared, a damaged checkpoint, a diverged run) ends
the run with one line naming it and exit status 1; `--traceback` shows where it was raised.
So does running out of device memory, naming the batch sizes to lower.
"""

import gc
import os
import re
import sys
import tempfile
import textwrap
from typing import NoReturn

import jax
import ml_collections
from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from jia_jax import bad_records
from jia_jax import checkpoint
from jia_jax import checkpoint_restore
from jia_jax import console
from jia_jax import evaluate
from jia_jax import export
from jia_jax import gpu_decode
from jia_jax import loop
from jia_jax import nvimgcodec_quiet
from jia_jax import os_thread_names
from jia_jax import process_per_gpu
from jia_jax import step_graphs
from jia_jax import xla_network

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Path to an ml_collections config file.", lock_config=True
)
_WORKDIR = flags.DEFINE_string(
    "workdir",
    None,
    "Directory for checkpoints and TensorBoard logs; a run given the "
    "same workdir resumes from its latest checkpoint.",
)
_MODE = flags.DEFINE_enum(
    "mode",
    "train",
    ["train", "eval", "export"],
    "train: train and evaluate, resuming from the workdir's newest checkpoint. eval: evaluate a "
    "checkpoint of the workdir on the eval split. export: write a checkpoint's parameters to "
    "one file (jia_jax/export.py).",
)
_STEP = flags.DEFINE_integer(
    "step", None, "With --mode=eval or export: the checkpoint's step (default: the newest)."
)
_EXPORT_PATH = flags.DEFINE_string(
    "export_path",
    None,
    "With --mode=export: the file to write (default: <workdir>/export/step_<step>.msgpack).",
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
    checkpoint_restore.NoReadableCheckpointError,
    checkpoint.CheckpointWriteError,
)
# ml_collections re-raises a TypeError or ValueError of a config file's `get_config` as a flag
# error of this text followed by the whole traceback.
_GET_CONFIG_FAILED = ": Error whilst parsing config file:"
# The checkout's root: it holds the shipped `configs` package beside `jia_jax`.
_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


def make_configs_importable(argv: list[str]) -> None:
    """Lets the `--config` file import the shipped configs and its own neighbours, from any
    working directory.

    A config file is loaded by path, so Python finds neither `configs` (the shipped ones, which
    import each other as `from configs import default`, and which a user's config may start
    from) nor the modules beside it. Appended to `sys.path`: the checkout root that holds
    `configs/`, and the config file's folder (its parent if the folder is a package, so that
    its modules are imported as the package's).
    """
    paths = [a.split("=", 1)[1] for a in argv if a.startswith("--config=")]
    paths += [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--config"]
    folders = [_REPO_ROOT] if os.path.isdir(os.path.join(_REPO_ROOT, "configs")) else []
    for path in paths[-1:]:
        folder = os.path.dirname(os.path.abspath(path.split(":", 1)[0]))
        is_package = os.path.isfile(os.path.join(folder, "__init__.py"))
        folders.append(os.path.dirname(folder) if is_package else folder)
    for folder in folders:
        if folder not in sys.path:
            sys.path.append(folder)


def parse_flags(argv: list[str]) -> list[str]:
    """absl's flag parsing; a config override or file that cannot apply is one line too."""
    make_configs_importable(argv)
    try:
        args = _parse_with_usage(argv)
        _CONFIG.value.get("seed")  # ml_collections defers a config file's load error to first use
    except (KeyError, AttributeError, OSError) as error:
        if "--traceback" in argv:
            raise
        sys.exit(f"FATAL Flags parsing error: {_flag_error(error, argv)}")
    return args


def _parse_with_usage(argv: list[str]) -> list[str]:
    """absl's `app.parse_flags_with_usage`, but a config file's `get_config` that raised is one
    line: the flag and the error, not the traceback ml_collections puts in the flag error."""
    try:
        return flags.FLAGS(argv)
    except flags.Error as error:
        message = str(error)
        if _GET_CONFIG_FAILED in message and "--traceback" not in argv:
            flag = message.split(_GET_CONFIG_FAILED, 1)[0]
            argument = flag.split(":", 1)[1:]  # ml_collections passes what follows the ':'
            call = f"get_config({', '.join(map(repr, argument))})"
            why = message.strip().splitlines()[-1].strip()
            sys.exit(
                f"FATAL Flags parsing error: {flag}: {call} raised {why} "
                "(--traceback shows where)"
            )
        text = f"\n{textwrap.indent(message, '  ')}" if "\n" in message else f" {message}"
        hint = "Pass --helpshort or --helpfull to see help on flags."
        sys.exit(f"FATAL Flags parsing error:{text}\n{hint}")


def check_mode_flags(mode: str, step: int | None, export_path: str | None) -> None:
    """Raises `ValueError` for --step or --export_path given where `mode` ignores it."""
    if step is not None and mode == "train":
        raise ValueError("--step does nothing with --mode=train; it is for --mode=eval or export.")
    if export_path is not None and mode != "export":
        raise ValueError(
            f"--export_path does nothing with --mode={mode}; it is for --mode=export."
        )


def check_workdir(workdir: str) -> None:
    """Raises `NotADirectoryError` if `workdir` exists and is not a directory."""
    if os.path.exists(workdir) and not os.path.isdir(workdir):
        raise NotADirectoryError(
            f"--workdir={workdir} is a file; give a directory (it is created if missing)."
        )


def set_xla_environment(config: ml_collections.ConfigDict) -> None:
    """Adds `config`'s process-wide XLA options to XLA_FLAGS (XLA reads them once, when JAX
    starts its backend: call before then), logging each one added."""
    added = xla_network.environment(config.comm, config.distributed, os.environ)
    os.environ.update(added)
    if added:
        logging.info("%s%s", xla_network.TOLD_LOG, xla_network.told(added["XLA_FLAGS"]))


def memory_error_text(error: BaseException, config: ml_collections.ConfigDict) -> str | None:
    """One line for XLA out of device memory, naming the batch sizes that set what a device
    holds; None for any other error."""
    out_of_memory = "out of memory" in str(error).lower()
    if not (isinstance(error, jax.errors.JaxRuntimeError) and out_of_memory):
        return None
    devices = jax.device_count()
    per_device = config.global_batch_size // devices
    micro = config.microbatch_size
    passes = micro if 0 < micro < per_device else per_device
    return (
        f"Out of device memory ({console.one_line(str(error), 160)}). Each of the {devices} "
        f"devices trains {passes} images a pass (global_batch_size={config.global_batch_size}, "
        f"microbatch_size={micro}) and evaluates {config.eval_batch_size // devices} "
        f"(eval_batch_size={config.eval_batch_size}): lower --config.microbatch_size (the "
        "global batch stays, in more passes) or --config.eval_batch_size; --traceback shows "
        "where it ran out."
    )


def train_as_processes(config: ml_collections.ConfigDict, count: int) -> int:
    """Trains `config` as `count` processes of one GPU each, started from this process's
    command line (jia_jax/process_per_gpu.py); returns the exit status."""
    logging.info(
        "Training as %d processes of one GPU each (distributed.process_per_gpu=%r): one process "
        "decoding for several GPUs does not keep up (docs/input_pipeline.md).",
        count, config.distributed.process_per_gpu,
    )
    port = process_per_gpu.free_port()
    with tempfile.TemporaryDirectory(prefix="jia_jax-errors-") as errors:
        commands = process_per_gpu.trainer_commands(
            sys.argv, count, config.data.num_workers, port, os.environ, errors
        )
        status = process_per_gpu.run_trainers(commands)
        for text in process_per_gpu.reported_errors(errors, count):
            print(text, file=sys.stderr)
    return status


def exit_with_error(text: str) -> NoReturn:
    """Exits with status 1 and `text`, the error's one line: on stderr, or where this process is
    one of the trainers of a launcher (`train_as_processes`), in the file it names, for it to
    print each trainer's same line once."""
    path = os.environ.get(process_per_gpu.ERROR_FILE)
    if not path:
        sys.exit(text)
    with open(path, "w") as f:
        f.write(text)
    sys.exit(1)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        sys.exit(
            f"FATAL Flags parsing error: unexpected arguments {argv[1:]}; flags are written "
            "--name=value (no spaces around '=')."
        )
    logging.get_absl_handler().addFilter(console.hide_library_info)
    os_thread_names.name_new_threads()  # before any thread of the run starts
    # Before JAX starts CUDA and XLA, which read these once (every mode may decode on the GPU).
    os.environ.update(gpu_decode.cuda_environment(_CONFIG.value.data.decode, os.environ))
    # What the imports built lives as long as the process: frozen, it is not walked again by the
    # collector's full passes while the step is traced and compiled (a digits run spent 1.0 s in
    # them on a 2-core machine, 0.5 s so). The loop freezes the rest after the first step.
    gc.freeze()
    try:
        check_mode_flags(_MODE.value, _STEP.value, _EXPORT_PATH.value)
        check_workdir(_WORKDIR.value)
        count = process_per_gpu.split_count(_CONFIG.value, _MODE.value, os.environ)
        if count > 1:
            sys.exit(train_as_processes(_CONFIG.value, count))
        os.environ.update(nvimgcodec_quiet.environment(_CONFIG.value.data.decode, os.environ))
        set_xla_environment(_CONFIG.value)
        if _MODE.value == "train":
            loop.train_and_evaluate(_CONFIG.value, _WORKDIR.value)
        elif _MODE.value == "eval":
            evaluate.evaluate_checkpoint(_CONFIG.value, _WORKDIR.value, _STEP.value)
        else:
            export.export_checkpoint(_CONFIG.value, _WORKDIR.value, _EXPORT_PATH.value, _STEP.value)
    except USER_ERRORS as error:
        if _TRACEBACK.value:
            raise
        exit_with_error(console.error_text(error))
    except jax.errors.JaxRuntimeError as error:
        text = memory_error_text(error, _CONFIG.value)
        if text is None and _MODE.value == "train":
            text = step_graphs.error_text(
                error,
                _CONFIG.value.launch.convolution_graphs,
                jax.default_backend(),
                os.environ.get("XLA_FLAGS", ""),
            )
        if text is None or _TRACEBACK.value:
            raise
        exit_with_error(text)


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
