"""Runs `python -m MODULE ARGS` in forked children of one process that has imported JAX already.

tests/test_doc_commands.py checks about fifty documented commands only as far as their argument
parsing. As fresh interpreters each paid Python's start-up and JAX's import (~2 s a command on a
2-core machine) for a parse of milliseconds; forked from this process they pay it once.

Protocol: one JSON request a line on stdin, `{"module", "args", "env", "cwd", "stop_at_parse",
"timeout"}`; one JSON reply a line on stdout, `{"returncode", "stderr"}`. A child runs the module as
`python -m` would (`runpy`, `__main__`), in exactly the environment given, its stdout discarded;
with `stop_at_parse` it exits 0 as soon as argparse has accepted the arguments. Only libraries
whose import defines nothing a module run as `__main__` defines again are imported beforehand
(not `jia_jax.main`, whose absl flags would be defined twice); they read their environment here,
before a child's, which a parse never reaches.
"""

import argparse
import json
import os
import runpy
import signal
import sys
import tempfile
import traceback

PREIMPORTED = ("absl.app", "flax.linen", "jax", "ml_collections", "numpy", "optax", "jia_jax.train")


def _stop_after_parsing() -> None:
    parse = argparse.ArgumentParser.parse_args

    def parse_and_stop(self, *args, **kwargs):
        parse(self, *args, **kwargs)
        raise SystemExit(0)

    argparse.ArgumentParser.parse_args = parse_and_stop


def _child(request: dict, stderr_fd: int) -> int:
    """The module's run in this (forked) process; its exit status."""
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.path[0] = request["cwd"]  # what `python -m` puts first
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(stderr_fd, 2)
    signal.alarm(int(request["timeout"]))
    if request["stop_at_parse"]:
        _stop_after_parsing()
    sys.argv = [request["module"], *request["args"]]
    try:
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        return 0
    except SystemExit as exit_:
        code = exit_.code
        if code is None or isinstance(code, int):
            return code or 0
        print(code, file=sys.stderr)
        return 1
    except BaseException:  # noqa: BLE001  reported as an interpreter would, status 1
        traceback.print_exc()
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def _check(request: dict) -> dict:
    with tempfile.TemporaryFile() as stderr:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = _child(request, stderr.fileno())
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        stderr.seek(0)
        text = stderr.read().decode(errors="replace")
    if os.WIFSIGNALED(status):
        signal_ = signal.Signals(os.WTERMSIG(status))
        past = f": past {request['timeout']} s" if signal_ == signal.SIGALRM else ""
        text += f"\nkilled by {signal_.name}{past}"
    return {"returncode": os.waitstatus_to_exitcode(status), "stderr": text}


def main() -> None:
    for name in PREIMPORTED:
        __import__(name)
    for line in sys.stdin:
        print(json.dumps(_check(json.loads(line))), flush=True)


if __name__ == "__main__":
    main()
