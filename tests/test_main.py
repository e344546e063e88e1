"""The command line as users run it: configs, overrides, clear errors for bad input."""

import json
import os
import pathlib
import re
import subprocess
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from configs import digits, resnet50_64k
from jia_jax import loop
from jia_jax import main
from jia_jax import process_per_gpu
from jia_jax import workdir_lock
from tests.main_util import flags_restored, main_in_process, run_main
from tests.test_metrics import read_scalars

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def resnet50_64k_run(tmp_path_factory) -> tuple[pathlib.Path, subprocess.CompletedProcess]:
    """(workdir, result) of the paper's ResNet-50 config, as is, with only sizes shrunk: 2 steps
    of 4 images of 8x8 (2 microbatches of 1 per device) on a 2x1 CPU mesh.

    Most of its time is compiling ResNet-50, which sizes barely change. At this size a step
    takes ~2 s without LLVM's optimisation (conftest.py's flags), which 32 images of 32x32 needed
    and which makes the compiles half as long again: ~25% less CPU. 2 devices, not 8: a quarter
    of what each device repeats (the replicated LARS update, the checkpoint's per-device copies);
    the config's flat all-reduce is the same psum over both mesh axes, and still crosses the two
    "nodes".
    """
    workdir = tmp_path_factory.mktemp("resnet50_64k")
    result = run_main(
        "--config=configs/resnet50_64k.py",
        f"--workdir={workdir}",
        "--config.data.name=synthetic",
        "--config.data.image_size=8",
        "--config.global_batch_size=4",
        "--config.microbatch_size=1",
        "--config.total_steps=2",
        "--config.optimizer.warmup_epochs=0",
        "--config.mesh.node=2",
        "--config.mesh.gpu=1",
        devices=2,
    )
    return workdir, result


def test_resnet50_64k_config_runs_on_cpu_with_small_overrides(resnet50_64k_run):
    """The paper's ResNet-50 config, as is, with only sizes shrunk: 2 steps on a 2x1 CPU mesh."""
    workdir, result = resnet50_64k_run
    assert result.returncode == 0, result.stderr[-3000:]
    assert "step 2/2" in result.stderr
    assert "{'node': 2, 'gpu': 1}" in result.stderr
    assert (workdir / "checkpoints" / "2").is_dir()
    # Step 2 is the first timed interval (step 1 compiled): its line and scalars say how much
    # of it went to waiting for input.
    line = re.search(r"step 2/2 \|.*", result.stderr)[0]
    assert re.search(r"\| [\d.]+ img/s \| input wait \d+% \| ETA ", line), line
    _, scalars = read_scalars(workdir)
    assert 0.0 <= scalars[("train/input_wait_fraction", 2)] <= 1.0, scalars


@pytest.mark.parametrize(
    "field, value",
    [
        ("model.name", "resnet51"),
        ("global_batch_size", 60),
        ("mesh.node", 3),
        ("comm.strategy", "ring"),
        ("comm.network", "carrier_pigeon"),
        ("precision.compute", "float8"),
        ("optimizer.name", "adam"),
        ("optimizer.decay", "step"),
        ("checkpoint_every_steps", 0),
        ("checkpoint_keep", 0),
        ("log_every_steps", 0),
        ("eval_every_steps", 0),
        ("microbatch_size", -2),
        ("data.image_size", 0),
        ("seed", -3),
        ("optimizer.momentum", -0.1),
        ("optimizer.momentum", 1.0),
        ("optimizer.weight_decay", -1e-4),
        ("loss.label_smoothing", 1.5),
        ("comm.bucket_bytes", -5),
        ("total_steps", 0),
    ],
)
def test_bad_config_fails_naming_the_field(tmp_path, field, value):
    config = digits.get_config()
    parent, _, leaf = field.rpartition(".")
    setattr(config[parent] if parent else config, leaf, value)
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        loop.train_and_evaluate(config, str(tmp_path))
    assert not (tmp_path / "checkpoints").exists()


def test_bf16_divergence_stops_naming_the_step_and_keeps_the_last_finite_checkpoint(tmp_path):
    # AlexNet-BN, not the digits ResNet-18: it compiles in half the time, and diverges the same.
    # 2 devices, not 8: a quarter of the per-device copies each save compiles and writes.
    # Together, ~40% of the test's time.
    result = run_main(
        "--config=configs/digits.py",
        f"--workdir={tmp_path}",
        "--config.precision.compute=bfloat16",
        "--config.model.name=alexnet_bn",
        "--config.model.width=4",
        "--config.data.image_size=8",
        "--config.total_steps=4",
        "--config.checkpoint_every_steps=1",
        "--config.checkpoint_keep=10",
        "--config.log_every_steps=1",
        "--config.optimizer.base_learning_rate=1e8",
        "--config.optimizer.warmup_epochs=0",
        "--config.mesh.node=2",
        "--config.mesh.gpu=1",
        devices=2,
    )
    assert result.returncode != 0, result.stderr[-3000:]
    match = re.search(r"NonFiniteLossError: Training diverged (at|by) step (\d+)", result.stderr)
    assert match, result.stderr[-3000:]
    diverged = int(match.group(2))
    assert diverged <= 4 and "final eval" not in result.stderr
    directory = tmp_path / "checkpoints"
    saved = sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())
    # A checkpoint every step: the newest is the step before the one named, and it is finite.
    assert saved and saved[-1] == diverged - 1, (saved, match.group(0))
    with ocp.StandardCheckpointer() as reader:
        state = reader.restore(directory / str(saved[-1]) / "state")
    leaves = jax.tree.leaves(state)
    assert leaves and all(np.isfinite(np.asarray(leaf)).all() for leaf in leaves)


def assert_one_clear_line(result: subprocess.CompletedProcess, pattern: str) -> None:
    """Exit status 1, no traceback, and the error is the last of at most 3 lines (the mesh line
    may come first; absl's flag errors add a hint)."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and len(lines) <= 3, result.stderr[-3000:]
    assert any(re.search(pattern, line) for line in lines), result.stderr[-3000:]


DIGITS = ("--config=configs/digits.py", "--config.model.width=2", "--config.data.image_size=8")


@pytest.mark.parametrize(
    "args, pattern",
    [
        (
            (*DIGITS, "--config.optimizr.name=lars"),
            r"--config\.optimizr\.name=lars: the config has no field 'optimizr'\. "
            r'Did you mean "optimizer"',
        ),
        (
            ("--config=configs/resnet50_64k.py", "--config.model.width=8"),
            r"--config\.model\.width=8: the config has no field 'width'\.",
        ),
        (
            (*DIGITS, "total_steps=3"),
            r"unexpected arguments \['total_steps=3'\]; flags are written --name=value",
        ),
        (
            ("--config=configs/no_such_config.py",),
            r"cannot load the config file: .*No such file .*no_such_config\.py",
        ),
        (
            (*DIGITS, "--config.precision.loss_scale.max_skips_at_minimum=0"),
            r"^ValueError: precision\.loss_scale\.max_skips_at_minimum=0 must be >= 1",
        ),
        ((*DIGITS, "--config.eval_batch_size=0"), r"^ValueError: eval_batch_size=0 must be pos"),
        ((*DIGITS, "--config.eval_batch_size=-8"), r"^ValueError: eval_batch_size=-8 must be pos"),
        (
            (*DIGITS, "--config.distributed.coordinator_address=127.0.0.1:12345"),
            r"^ValueError: distributed\.coordinator_address is set, so distributed\.num_processes",
        ),
        (
            (*DIGITS, "--config.comm.dtype=float16"),
            r"^ValueError: comm\.dtype='float16' needs precision\.compute='float16'.*'bfloat16'",
        ),
        (
            (*DIGITS, "--config.comm.network=infiniband"),
            r"^ValueError: comm\.network='infiniband' is not one of",
        ),
    ],
    ids=[
        "misspelled",
        "new_key",
        "stray_args",
        "config_file",
        "max_skips",
        "eval_0",
        "eval_neg",
        "launch",
        "fp16_wire",
        "told_network",
    ],
)
def test_config_mistake_is_one_line_and_leaves_no_workdir(tmp_path, args, pattern):
    result = run_main(*args, f"--workdir={tmp_path / 'run'}", timeout=120)
    assert_one_clear_line(result, pattern)
    assert not (tmp_path / "run").exists()


def test_traceback_switch_shows_where_the_error_was_raised(tmp_path):
    result = run_main(*DIGITS, "--config.eval_batch_size=0", f"--workdir={tmp_path}", "--traceback")
    assert result.returncode == 1
    assert "Traceback" in result.stderr and "input_pipeline.py" in result.stderr


@pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning")
@pytest.mark.parametrize(
    "config, why",
    [
        (
            "configs/digits.py:large",
            r"get_config\('large'\) raised TypeError: get_config\(\) takes 0 positional "
            r"arguments but 1 was given",
        ),
        (
            "configs/digits_large_batch.py:lars",
            r"get_config\('lars'\) raised ValueError: recipe 'lars' is not one of "
            r"\('small_sgd', .*'large_lars'\)\.",
        ),
    ],
)
def test_a_config_files_get_config_that_raises_is_one_line(tmp_path, config, why):
    """ml_collections puts the whole traceback of the config file's `get_config` in its flag
    error; the user gets the call and its error in one line, the traceback on --traceback."""
    argv = ["main", f"--config={config}", f"--workdir={tmp_path}"]
    for traceback in (False, True):
        with flags_restored(), pytest.raises(SystemExit) as stopped:
            main.parse_flags(argv + ["--traceback"] * traceback)
        if traceback:
            assert "Traceback" in stopped.value.code and "get_config" in stopped.value.code
        else:
            assert re.fullmatch(
                rf"FATAL Flags parsing error: flag --config={re.escape(config)}: {why} "
                r"\(--traceback shows where\)",
                stopped.value.code,
            ), stopped.value.code


# ml_collections loads the config file with the import machinery's deprecated load_module.
@pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning")
def test_out_of_device_memory_is_one_line_naming_the_batches_to_lower(tmp_path, monkeypatch):
    """XLA's own out-of-memory error (a real one, from this CPU backend) reaching the command
    line: one line naming the per-device batches, not a traceback."""
    try:
        jax.numpy.zeros(1 << 42, jax.numpy.uint8).block_until_ready()  # 4 TiB
    except jax.errors.JaxRuntimeError as error:
        out_of_memory = error

    def train(*_):
        raise out_of_memory

    monkeypatch.setattr(loop, "train_and_evaluate", train)
    args = ("--config=configs/digits.py", f"--workdir={tmp_path}")
    with pytest.raises(SystemExit) as stopped:
        main_in_process(*args)
    assert re.fullmatch(
        r"Out of device memory \(RESOURCE_EXHAUSTED: Out of memory allocating 4398046511104 "
        r"bytes\.\)\. Each of the 8 devices trains 8 images a pass \(global_batch_size=64, "
        r"microbatch_size=0\) and evaluates 16 \(eval_batch_size=128\): lower "
        r"--config\.microbatch_size .* or --config\.eval_batch_size; --traceback shows where it "
        r"ran out\.",
        str(stopped.value.code),
    )
    config = digits.get_config()
    config.microbatch_size = 2  # passes of 2 of each device's 8
    assert "trains 2 images a pass" in main.memory_error_text(out_of_memory, config)
    with pytest.raises(jax.errors.JaxRuntimeError):  # --traceback: the error itself
        main_in_process(*args, "--traceback")

    def fail(*_):
        raise jax.errors.JaxRuntimeError("INTERNAL: a failure of XLA's own")

    monkeypatch.setattr(loop, "train_and_evaluate", fail)
    with pytest.raises(jax.errors.JaxRuntimeError, match="INTERNAL"):  # a bug: its traceback
        main_in_process(*args)


# ml_collections loads the config file with the import machinery's deprecated load_module.
@pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning")
def test_a_trainer_of_mains_launcher_leaves_its_error_line_in_the_file_it_names(
    tmp_path, monkeypatch, capsys
):
    def train(*_):
        raise ValueError("data.image_size=0 must be positive")

    monkeypatch.setattr(loop, "train_and_evaluate", train)
    monkeypatch.setenv(process_per_gpu.ERROR_FILE, str(tmp_path / "trainer_1"))
    with pytest.raises(SystemExit) as stopped:
        main_in_process("--config=configs/digits.py", f"--workdir={tmp_path / 'run'}")
    assert stopped.value.code == 1
    assert (tmp_path / "trainer_1").read_text() == "ValueError: data.image_size=0 must be positive"
    assert "image_size" not in capsys.readouterr().err  # the launcher prints it, once


def test_workdir_that_is_a_file_is_one_line_and_the_file_is_kept(tmp_path):
    workdir = tmp_path / "notes.txt"
    workdir.write_text("mine")
    result = run_main(*DIGITS, f"--workdir={workdir}", timeout=120)
    assert_one_clear_line(result, rf"^NotADirectoryError: --workdir={workdir} is a file")
    assert workdir.read_text() == "mine"


def test_a_second_run_on_a_workdir_in_training_is_one_line_and_touches_nothing(tmp_path):
    # Before the lock the second run trained into the first's checkpoints, each deleting the
    # other's past checkpoint_keep.
    workdir = tmp_path / "run"
    with workdir_lock.held(str(workdir)):  # as the first run's process holds it
        result = run_main(*DIGITS, f"--workdir={workdir}", "--config.total_steps=2",
                          "--config.optimizer.warmup_epochs=0", timeout=120)
    assert_one_clear_line(
        result, rf"^WorkdirInUseError: --workdir={workdir} is in use by another training run "
        rf"\(process {os.getpid()} on .*\): stop that run, or give this one another --workdir\.$"
    )
    assert sorted(p.name for p in workdir.iterdir()) == [workdir_lock.LOCK_NAME]


def test_missing_dataset_names_the_directory_tfds_looked_in(tmp_path):
    """No data.data_dir: tfds's default ($TFDS_DATA_DIR) is named, in commands that run as is."""
    default = tmp_path / "tfds"
    result = subprocess.run(
        [sys.executable, "-m", "jia_jax.main", "--config=configs/resnet50_64k.py"]
        + [f"--workdir={tmp_path / 'run'}"],
        cwd=REPO,
        env=dict(os.environ, JAX_PLATFORMS="cpu", TFDS_DATA_DIR=str(default)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    # The mesh line, the error naming the flag, and one line of hint: the commands that prepare
    # it; no warning of tfds's about the folder it did not find before them.
    mesh, error, hint = result.stderr.strip().splitlines()
    assert "mesh" in mesh, result.stderr
    assert error.startswith(f"DatasetNotPreparedError: Dataset 'imagenet2012' is not prepared in "
                            f"'{default}' (tfds's default; set --config.data.data_dir to where")
    assert f"tfds build imagenet2012 --data_dir={default} " in hint
    assert f"tfds convert_format --dataset_dir={default}/imagenet2012 " in hint
    assert "None" not in result.stderr
    assert not (tmp_path / "run").exists()


def test_dataset_missing_from_the_given_data_dir_names_the_flag(tmp_path):
    result = run_main(
        "--config=configs/resnet50_64k.py",
        f"--workdir={tmp_path / 'run'}",
        f"--config.data.data_dir={tmp_path}",
        timeout=120,
    )
    assert_one_clear_line(
        result,
        rf"^DatasetNotPreparedError: Dataset 'imagenet2012' is not prepared in '{tmp_path}' "
        r"\(--config\.data\.data_dir\): no ",
    )
    assert not any(line.startswith("W") for line in result.stderr.splitlines()), result.stderr


@pytest.mark.parametrize("where", ["/proc/jia_jax_run", "under_a_file"])
def test_workdir_that_cannot_be_created_is_one_line_naming_the_flag(tmp_path, where):
    if where == "under_a_file":
        (tmp_path / "notes.txt").write_text("mine")
        where = str(tmp_path / "notes.txt" / "run")
    elif not os.path.isdir("/proc"):
        pytest.skip("no /proc here")
    result = run_main(
        *DIGITS,
        f"--workdir={where}",
        "--config.total_steps=2",
        "--config.optimizer.warmup_epochs=0",
        timeout=120,
    )
    assert_one_clear_line(
        result, rf"^OSError: --workdir={re.escape(where)}: cannot create .*; give a directory"
    )


def test_a_normal_run_prints_no_library_info_lines(resnet50_64k_run):
    """No INFO line from JAX (its search for libtpu) or orbax: only the trainer's own.

    The ResNet-50 run above is such a run (JAX started, steps logged, an orbax checkpoint saved);
    reading its log spares a run of its own.
    """
    _, result = resnet50_64k_run
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    ours = r"I\d{4} [\d:.]+ +\d+ (loop|main|train)\.py:\d+\] "  # train: how gradients are sent
    assert lines and all(re.match(ours, line) for line in lines), lines


# `python -m jia_jax.main ARGS` as a `pip install -e .` runs it: `jia_jax` importable, but not
# the checkout's root (an editable install's finder maps the package alone), so `configs` is
# not importable unless the trainer makes it so. Prints the loaded config.
EDITABLE_INSTALL = """
import importlib.util, os, sys
repo = sys.argv[1]
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != repo]
spec = importlib.util.spec_from_file_location(
    "jia_jax", os.path.join(repo, "jia_jax", "__init__.py"),
    submodule_search_locations=[os.path.join(repo, "jia_jax")],
)
sys.modules["jia_jax"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sys.modules["jia_jax"])
from absl import flags
from jia_jax import main
main.parse_flags(["main", *sys.argv[2:]])
print(flags.FLAGS.config.to_json())
"""


def load_elsewhere(cwd: pathlib.Path, *args: str) -> dict:
    """The config `python -m jia_jax.main ARGS` loads when run in `cwd` from an editable install."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, "-c", EDITABLE_INSTALL, str(REPO), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


def test_a_shipped_config_loads_from_another_working_directory(tmp_path):
    config = load_elsewhere(tmp_path, f"--config={REPO}/configs/digits.py", "--workdir=run")
    assert config["data"]["name"] == "digits"
    assert config["optimizer"]["warmup_epochs"] == digits.get_config().optimizer.warmup_epochs


USER_CONFIG = '''"""My run: the shipped 64K recipe at batch 8,192 with a 5-epoch warmup."""
from configs import resnet50_64k


def get_config():
    config = resnet50_64k.get_config()
    config.global_batch_size = 8192
    config.optimizer.warmup_epochs = 5.0
    return config
'''


def test_a_users_config_elsewhere_starts_from_a_shipped_one(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "my_64k.py").write_text(USER_CONFIG)
    config = load_elsewhere(tmp_path, "--config=mine/my_64k.py", "--workdir=run")
    assert config["global_batch_size"] == 8192
    assert config["optimizer"]["warmup_epochs"] == 5.0
    # The rest is the shipped recipe, its learning rate scaled to the new batch.
    shipped = resnet50_64k.get_config()
    assert config["optimizer"]["name"] == "lars" == shipped.optimizer.name
    assert config["optimizer"]["momentum"] == shipped.optimizer.momentum
    expected_lr = shipped.optimizer.base_learning_rate * 8192 / 256
    assert abs(config["optimizer"]["learning_rate"] - expected_lr) <= 1e-12 * expected_lr
