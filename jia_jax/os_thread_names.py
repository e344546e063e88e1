"""Python threads named for the operating system, so that `top -H`, `ps -L`, perf and /proc show
which thread is which (the input thread, each decoder's, grain's), not the process's name for all.

CPython before 3.14 leaves every thread it starts with the name of the process. Linux keeps the
first 15 bytes of a thread's name; elsewhere nothing is named.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from types import FrameType
from typing import Any

_PR_SET_NAME = 15  # prctl(2)
NAME_BYTES = 15


def name_current_thread(name: str) -> bool:
    """Names the calling thread `name` (its first 15 bytes) for the OS: whether it could."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return False
    return libc.prctl(_PR_SET_NAME, name.encode()[:NAME_BYTES], 0, 0, 0) == 0


def name_new_threads() -> None:
    """Each thread `threading` starts from now on names itself after its `Thread.name` as it
    starts, through the hook `threading.setprofile` installs in new threads (removed at once).

    Leaves a hook another tool installed in place, and then names nothing.
    """
    if threading.getprofile() is None:
        threading.setprofile(_name_once)


def _name_once(frame: FrameType, event: str, arg: Any) -> None:
    del frame, event, arg
    sys.setprofile(None)  # only the thread's first event: no cost to the rest of its life
    name_current_thread(threading.current_thread().name)
