"""The program a wrapper script runs as `python -m` would: `-- -m MODULE [ARG ...]` on the
wrapper's command line (scripts/bench/gc_pauses.py, scripts/bench/planar_decode.py)."""

from __future__ import annotations

import argparse
import runpy
import sys


def add_argument(parser: argparse.ArgumentParser) -> None:
    """Adds the positional `program`: everything after the wrapper's own flags."""
    parser.add_argument("program", nargs=argparse.REMAINDER,
                        help="-- -m MODULE [ARG ...]: the program, as after `python`")


def module_argv(parser: argparse.ArgumentParser, program: list[str]) -> list[str]:
    """[MODULE, ARG, ...] of the parsed `program` (a leading `--` dropped); a usage error
    through `parser` unless it is `-m MODULE [ARG ...]`."""
    program = program[1:] if program[:1] == ["--"] else program
    if len(program) < 2 or program[0] != "-m":
        parser.error("give the program as -- -m MODULE [ARG ...]")
    return program[1:]


def run(module_and_args: list[str]) -> None:
    """Runs MODULE as `python -m MODULE ARG ...` would, in this process."""
    sys.argv = list(module_and_args)
    runpy.run_module(module_and_args[0], run_name="__main__", alter_sys=True)
