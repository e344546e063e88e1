"""Tests for jia_jax/os_thread_names.py: threads named for the OS (Linux: /proc's comm)."""

import pathlib
import subprocess
import sys
import threading

import pytest

from jia_jax import os_thread_names

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="names via prctl")


def _os_name(thread: threading.Thread) -> str:
    return pathlib.Path(f"/proc/self/task/{thread.native_id}/comm").read_text().strip()


def _started(name: str) -> tuple[threading.Thread, threading.Event]:
    """A thread named `name`, running its target (the hook names it as the target starts, after
    `start` returns) until the returned event is set."""
    running, done = threading.Event(), threading.Event()

    def target():
        running.set()
        done.wait()

    thread = threading.Thread(target=target, name=name)
    thread.start()
    running.wait()
    return thread, done


def test_threads_started_after_the_hook_carry_their_names_cut_to_15_bytes():
    # A test that ran jia_jax.main in this process before may have left the hook installed.
    previous = threading.getprofile()
    threading.setprofile(None)
    before, release_before = _started("started-before")
    os_thread_names.name_new_threads()
    try:
        short, release_short = _started("decode_0")
        long, release_long = _started("grain-thread-prefetch-ThreadPrefetchDatasetIterator")
        assert _os_name(short) == "decode_0"
        assert _os_name(long) == "grain-thread-pr"  # Linux keeps 15 bytes
        assert _os_name(before) != "started-before"  # a thread already running keeps its own
        assert sys.getprofile() is None  # the hook is the new threads', never this one's
    finally:
        threading.setprofile(previous)
        for release in (release_before, release_short, release_long):
            release.set()


def test_a_profile_hook_another_tool_set_is_left_in_place():
    def other(frame, event, arg):
        pass

    previous = threading.getprofile()
    threading.setprofile(other)
    try:
        os_thread_names.name_new_threads()
        assert threading.getprofile() is other
    finally:
        threading.setprofile(previous)


def test_the_trainer_names_the_threads_of_its_run(tmp_path):
    """`python -m jia_jax.main` installs the hook before the run starts its threads: a thread
    the (stubbed) run starts has its name in /proc."""
    snippet = """
import pathlib, sys, threading
from absl import app
from jia_jax import loop, main

def run(config, workdir):
    running, done = threading.Event(), threading.Event()
    thread = threading.Thread(target=lambda: (running.set(), done.wait()), name="gpu-input")
    thread.start()
    running.wait()
    print("comm", pathlib.Path(f"/proc/self/task/{thread.native_id}/comm").read_text().strip())
    done.set()
    thread.join()

loop.train_and_evaluate = run
sys.argv = ["main", "--config=configs/digits.py", "--workdir=" + sys.argv[1]]
app.run(main.main, flags_parser=main.parse_flags)
"""
    repo = pathlib.Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, "-c", snippet, str(tmp_path / "workdir")],
        cwd=repo, capture_output=True, text=True, timeout=300,
    )
    assert "comm gpu-input" in out.stdout, out.stderr[-2000:]
