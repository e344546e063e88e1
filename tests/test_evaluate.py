"""`python -m jia_jax.main --mode=eval`: a finished run's checkpoints evaluated on their own."""

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.main_util import DIGITS_RUN_FLAGS, run_main


def run_on(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    return run_main(*DIGITS_RUN_FLAGS, f"--workdir={workdir}", *args)


def digests(directory: Path) -> dict[str, str]:
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def eval_line(stderr: str, step: int) -> re.Match:
    match = re.search(
        rf"eval of the checkpoint of step {step} in \S+/checkpoints: top-1 ([\d.]+), top-5 "
        rf"([\d.]+), loss ([\d.]+) over (\d+) examples$",
        stderr,
        re.MULTILINE,
    )
    assert match, stderr[-3000:]
    return match


def test_eval_prints_the_top1_the_run_printed_and_changes_nothing(digits_run):
    workdir, log = digits_run
    before = digests(workdir)
    newest = run_on(workdir, "--mode=eval")
    earlier = run_on(workdir, "--mode=eval", "--step=15")
    assert newest.returncode == 0 and earlier.returncode == 0, newest.stderr + earlier.stderr
    # The run's own evaluations of the same states, printed to 4 decimals as the eval line is.
    final = re.search(r"final eval at step 30: top-1 ([\d.]+), top-5 ([\d.]+) over 360", log)
    midway = re.search(r"step 15: eval top-1 ([\d.]+)$", log, re.MULTILINE)
    assert final and midway, log
    line = eval_line(newest.stderr, 30)
    assert (line.group(1), line.group(2), line.group(4)) == (*final.groups(), "360")
    assert eval_line(earlier.stderr, 15).group(1) == midway.group(1)
    assert digests(workdir) == before


def test_eval_of_a_missing_step_lists_the_steps_there(digits_run):
    workdir, _ = digits_run
    result = run_on(workdir, "--mode=eval", "--step=7")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) <= 2, result.stderr[-3000:]
    assert lines[-1] == (
        f"FileNotFoundError: --step=7: {workdir}/checkpoints holds no checkpoint of that step; "
        "it holds steps [15, 30]."
    )


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_eval_of_an_unreadable_checkpoint_is_one_line_and_moves_nothing(digits_run, tmp_path):
    workdir = tmp_path / "run"
    shutil.copytree(digits_run[0], workdir)
    for path in (workdir / "checkpoints" / "30" / "state").rglob("*"):
        if path.is_file() and path.parent.name == "d":
            os.truncate(path, path.stat().st_size // 2)
    before = digests(workdir)
    result = run_on(workdir, "--mode=eval")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) <= 2, result.stderr[-3000:]
    assert re.match(
        rf"NoReadableCheckpointError: The checkpoint of step 30 in {workdir}/checkpoints cannot "
        r"be read \(.{20,200}\); --step= one of \[15\] reads another\.$",
        lines[-1],
    ), lines[-1]
    assert digests(workdir) == before


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ("--export_path=/tmp/model.msgpack", "--mode=eval"),
            "--export_path does nothing with --mode=eval; it is for --mode=export.",
        ),
        (("--step=3",), "--step does nothing with --mode=train; it is for --mode=eval or export."),
    ],
)
def test_eval_and_export_flags_are_refused_where_they_do_nothing(tmp_path, args, message):
    result = run_on(tmp_path, *args)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and lines == [f"ValueError: {message}"], result.stderr[-3000:]
    assert not (tmp_path / "checkpoints").exists()
