"""jia_jax/workdir_lock.py: one training run per workdir, released however the run ends."""

import os
import signal
import socket
import subprocess
import sys

import pytest

from jia_jax import workdir_lock


def test_a_second_holder_is_refused_naming_the_first_until_it_lets_go(tmp_path):
    workdir = str(tmp_path / "run")  # created by the first holder
    with workdir_lock.held(workdir):
        lock = tmp_path / "run" / workdir_lock.LOCK_NAME
        assert lock.read_text().startswith(f"process {os.getpid()} on {socket.gethostname()}, ")
        # flock belongs to an open file: a second open, even in this process, is refused.
        with pytest.raises(workdir_lock.WorkdirInUseError) as refused:
            with workdir_lock.held(workdir):
                pass
        assert str(refused.value) == (
            f"--workdir={workdir} is in use by another training run ({lock.read_text().strip()}): "
            "stop that run, or give this one another --workdir."
        )
        assert isinstance(refused.value, OSError)  # main's one-line user errors
        with workdir_lock.held(workdir, primary=False):  # a run's other processes take none
            pass
    with workdir_lock.held(workdir):  # let go at the block's end
        pass


def test_a_killed_holder_leaves_the_workdir_free(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from jia_jax import workdir_lock\n"
         f"with workdir_lock.held({str(tmp_path)!r}):\n"
         "    print('held', flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(workdir_lock.WorkdirInUseError, match=f"process {holder.pid} on "):
            with workdir_lock.held(str(tmp_path)):
                pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with workdir_lock.held(str(tmp_path)):
        pass
