"""Every command and Python snippet the docs show works as pasted.

Collected from README.md, docs/*.md, notebooks/README.md and the configs' docstrings, whatever
they hold when the tests run:

- ```python blocks run in order, one process per file (a page reads top to bottom), unless an
  HTML comment `<!-- doc-test: sketch ... -->` right above marks a block as a sketch: it is
  compiled only.
- Shell commands (fenced blocks whose first line is a command, and inline `...` spans that start
  with one) are split into simple commands; each is
  - run, with tiny overrides (2 steps of a smaller model), when it is `python -m jia_jax.main`
    on the bundled digits in one process: it must exit 0; a repeat of a command is checked only,
    and an eval or export of a run an earlier command trained reads that run;
  - checked without running otherwise (ImageNet, GPUs, several processes, long studies): the
    trainer's flag parser (`--only_check_args`) or a script's argparse parser must accept its
    arguments (a script that reads sys.argv itself runs), a `python -m` module must exist, a
    shell script must be executable and pass `bash -n` with the trainer accepting the config and
    overrides it is given. These parses run in forked children of one process that imported JAX
    once (tests/fork_checker.py);
  - parsed only when it is setup or another tool (pip, venv, tfds, jupyter, tensorboard, ...), or
    a template with placeholders (`...`, `<json>`).

A failure names the file, the line and the command.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib.util
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys
import tempfile
import tomllib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
PAGES = [
    "README.md",
    "notebooks/README.md",
    *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md")),
]
CONFIGS = sorted(str(p.relative_to(REPO)) for p in (REPO / "configs").glob("*.py"))

PYTHON = {"python", "python3"}
# Programs a doc may show that are not this repository's: their commands are parsed only.
OTHER_TOOLS = {
    "pip",
    "pip3",
    "tfds",
    "jupyter",
    "tensorboard",
    ".",
    "source",
    "truncate",
    "nvidia-smi",
    # shell utilities a walkthrough may use around the real commands
    *("cd", "export", "wait", "kill", "sleep", "echo", "cat", "ls", "mkdir", "rm", "cp", "tail"),
    *("tee", "grep", "git"),
}
# Launchers in front of the real command: `mpirun -np 4 python ...`, `taskset -c 0 python ...`.
LAUNCHERS = {"sbatch", "srun", "mpirun", "taskset", "env", "nohup"}
NOT_RUN_MODULES = {"venv", "pytest", "pip"}
# What shrinks a digits run to seconds; only the fields a config has are set.
TINY = {
    "total_steps": 2,
    "optimizer.warmup_epochs": 0,
    "model.width": 2,
    "data.image_size": 8,
    "log_every_steps": 1,
}
CHEAP_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
TIMEOUT_S = 300


@dataclasses.dataclass(frozen=True)
class Command:
    source: str  # "file:line"
    text: str

    def __str__(self) -> str:
        return f"{self.source}: {self.text}"


def _words(text: str) -> list[str]:
    return shlex.split(text, comments=True)


def _program(words: list[str]) -> str | None:
    """The first word that is not an environment assignment."""
    for word in words:
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", word):
            return word
    return None


def _is_command(text: str) -> bool:
    try:
        program = _program(_words(text))
    except ValueError:
        return False
    known = PYTHON | OTHER_TOOLS | LAUNCHERS | {"bash"}
    return program is not None and (program in known or program.startswith("scripts/"))


def _python_blocks_and_commands(page: str) -> tuple[list[tuple[str, str, bool]], list[Command]]:
    """A page's ```python blocks as (source, code, is_sketch) and its shell commands."""
    lines = (REPO / page).read_text().splitlines()
    blocks, commands, prose = [], [], []
    i = 0
    while i < len(lines):
        fence = re.match(r"^\s*```(\w*)\s*$", lines[i])
        if not fence:
            prose.append((i + 1, lines[i]))
            i += 1
            continue
        start, lang = i + 1, fence.group(1)
        sketch = i > 0 and "doc-test: sketch" in lines[i - 1]
        end = next(j for j in range(start, len(lines)) if re.match(r"^\s*```\s*$", lines[j]))
        indent = len(lines[i]) - len(lines[i].lstrip())
        code = "\n".join(line[indent:] for line in lines[start:end])
        if lang == "python":
            blocks.append((f"{page}:{start}", code, sketch))
        elif lang in ("bash", "sh", "shell") or (
            not lang and code.strip() and _is_command(code.strip().splitlines()[0])
        ):
            commands += _shell_commands(page, start + 1, code)
        i = end + 1
    commands += _inline_commands(page, prose)
    return blocks, commands


def _shell_commands(page: str, first_line: int, code: str) -> list[Command]:
    """A shell block's simple commands (continuations joined, split at &&, ||, ;, & and |)."""
    commands, pending, pending_line = [], "", first_line
    for number, line in enumerate(code.splitlines(), first_line):
        if not pending:
            pending_line = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        for part in re.split(r"\s(?:&&|\|\||\||&)\s|\s*;\s*|\s&$", pending + line):
            if part.strip() and not part.strip().startswith("#"):
                commands.append(Command(f"{page}:{pending_line}", " ".join(part.split())))
        pending = ""
    return commands


def _inline_commands(page: str, prose: list[tuple[int, str]]) -> list[Command]:
    text = "\n".join(line for _, line in prose)
    starts = [number for number, _ in prose]
    commands = []
    for span in re.finditer(r"(?<!`)`([^`]+)`(?!`)", text):
        content = " ".join(span.group(1).split())
        if _is_command(content):
            line = starts[text.count("\n", 0, span.start())]
            commands += [Command(c.source, c.text) for c in _shell_commands(page, line, content)]
    return commands


def _docstring_commands(path: str) -> list[Command]:
    """Commands in a config's docstring: indented lines that start with a command."""
    doc = ast.get_docstring(ast.parse((REPO / path).read_text())) or ""
    lines = doc.splitlines()
    commands, i = [], 0
    while i < len(lines):
        if lines[i].startswith("  ") and _is_command(lines[i].strip().rstrip("\\")):
            start, text = i, ""
            while lines[i].rstrip().endswith("\\"):
                text += lines[i].rstrip()[:-1] + " "
                i += 1
            commands.append(
                Command(f"{path}:docstring line {start + 2}", " ".join((text + lines[i]).split()))
            )
        i += 1
    return commands


@functools.cache
def collected() -> tuple[list[tuple[str, list[tuple[str, str, bool]]]], list[Command]]:
    snippets, commands = [], []
    for page in PAGES:
        if not (REPO / page).exists():
            continue
        blocks, page_commands = _python_blocks_and_commands(page)
        if blocks:
            snippets.append((page, blocks))
        commands += page_commands
    for path in CONFIGS:
        commands += _docstring_commands(path)
    return snippets, commands


def _env_and_words(text: str) -> tuple[dict[str, str], list[str]]:
    """(environment assignments, the command) with launchers in front stripped."""
    words = _words(text)
    env = {}
    while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    if words and words[0] in LAUNCHERS:
        # Skip the launcher's own options up to the command it starts.
        words = words[1:]
        while words and words[0] not in PYTHON and not words[0].startswith("scripts/"):
            words = words[1:]
    return env, words


def _environment(env: dict[str, str]) -> dict[str, str]:
    """The test's environment but XLA_FLAGS (a doc command that needs them must say so), on the
    CPU, the checkout importable, and the command's own assignments."""
    base = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    return {**base, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO), **env}


def _run(
    args: list[str], env: dict[str, str], timeout: float = TIMEOUT_S
) -> subprocess.CompletedProcess:
    return subprocess.run(
        args, cwd=REPO, env=_environment(env), capture_output=True, text=True, timeout=timeout
    )


def _is_template(words: list[str]) -> bool:
    return any("..." in w or "…" in w or re.search(r"<\w+>", w) for w in words)


def _overrides(words: list[str]) -> dict[str, str]:
    return dict(m.groups() for w in words if (m := re.match(r"^--config\.([\w.]+)=(.*)$", w)))


def _config(words: list[str]):
    """The config the trainer would build from `--config=...` and its overrides (or None)."""
    paths = [w.split("=", 1)[1] for w in words if w.startswith("--config=")]
    if not paths:
        return None
    path, *arg = paths[0].split(":")
    spec = importlib.util.spec_from_file_location("doc_config", REPO / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config(*arg)
    for field, value in _overrides(words).items():
        if field in ("data.name",):
            config.data.name = value
    return config


def _has(config, field: str) -> bool:
    node = config
    for part in field.split("."):
        if part not in node:
            return False
        node = node[part]
    return True


_RUN_ONCE: set[tuple[str, ...]] = set()
# The trainer's flags of --mode=eval and export.
_NOT_TRAINING_FLAGS = ("--mode=", "--step=", "--export_path=")
# Where each training command (its arguments but --workdir) already ran: an eval or export
# command of that run reads it there instead of training it again.
_TRAINED: dict[tuple[str, ...], pathlib.Path] = {}


def _run_key(args: list[str]) -> tuple[str, ...]:
    return tuple(sorted(w for w in args if not w.startswith("--workdir")))


def _in_tmp(arg: str, tmp_path) -> str:
    """`arg` with a path it names for output moved into `tmp_path`."""
    for flag, name in (("--workdir=", ""), ("--export_path=", "exported.msgpack")):
        if arg.startswith(flag):
            return f"{flag}{tmp_path / name}"
    return arg


def _check_trainer(
    command: Command, env: dict[str, str], args: list[str], tmp_path, checker: _Checker
) -> None:
    """`python -m jia_jax.main ARGS`: run on digits in one process, else flag-checked."""
    config = _config(args)
    key = _run_key(args)
    one_process = not any(w.startswith("--config.distributed.") for w in args)
    if config is not None and config.data.name == "digits" and one_process and key not in _RUN_ONCE:
        _RUN_ONCE.add(key)
        tiny = [f"--config.{k}={v}" for k, v in TINY.items() if _has(config, k)]
        # In a fresh directory (one named in a doc may hold an earlier run's checkpoints).
        argv = [_in_tmp(a, tmp_path) for a in args]
        # Cheaper XLA compiles (as tests/test_resume.py): the same program, built faster.
        fast = {**env, "XLA_FLAGS": env.get("XLA_FLAGS", "") + " " + CHEAP_COMPILE}
        runs = [argv]
        if any(a.startswith("--mode=") and a != "--mode=train" for a in argv):
            # It evaluates or exports a run: the same command trains one there first, unless an
            # earlier command trained it already.
            training = [a for a in argv if not a.startswith(_NOT_TRAINING_FLAGS)]
            trained = _TRAINED.get(_run_key(training))
            if trained is None:
                runs.insert(0, training)
            else:
                runs = [[_in_tmp(a, trained) for a in args]]
        for run in runs:
            result = _run([sys.executable, "-m", "jia_jax.main", *run, *tiny], fast)
            assert result.returncode == 0, (
                f"{command}\nfailed when run (with {tiny}):\n{result.stderr[-3000:]}"
            )
        if not any(a.startswith(_NOT_TRAINING_FLAGS) for a in runs[0]):
            _TRAINED[_run_key(runs[0])] = tmp_path
        return
    returncode, stderr = checker.run("jia_jax.main", [*args, "--only_check_args"], env, False)
    assert returncode == 0, f"{command}\nthe trainer refuses its flags:\n{stderr[-3000:]}"


class _Checker:
    """`python -m MODULE ARGS`, in the environment `_run` gives, as far as a check needs, in forked
    children of one warm process (tests/fork_checker.py) instead of a fresh interpreter each."""

    def __init__(self) -> None:
        self._log = tempfile.TemporaryFile()
        self._process = subprocess.Popen(
            [sys.executable, "-m", "tests.fork_checker"],
            cwd=REPO,
            env=_environment({}),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )

    def run(
        self, module: str, args: list[str], env: dict[str, str], stop_at_parse: bool
    ) -> tuple[int, str]:
        """(returncode, stderr): `stop_at_parse` exits 0 once argparse has accepted `args` (a
        module that reads sys.argv itself, such as the renderer, runs to its end)."""
        request = {
            "module": module,
            "args": args,
            "env": _environment(env),
            "cwd": str(REPO),
            "stop_at_parse": stop_at_parse,
            "timeout": TIMEOUT_S,
        }
        self._process.stdin.write(json.dumps(request) + "\n")
        self._process.stdin.flush()
        line = self._process.stdout.readline()
        if not line:
            self._log.seek(0)
            pytest.fail(f"tests/fork_checker.py ended:\n{self._log.read().decode()[-3000:]}")
        reply = json.loads(line)
        return reply["returncode"], reply["stderr"]

    def close(self) -> None:
        self._process.stdin.close()
        self._process.wait(timeout=60)
        self._log.close()


@pytest.fixture(scope="module")
def checker():
    checker = _Checker()
    yield checker
    checker.close()


def _check_module(
    command: Command, env: dict[str, str], module: str, args: list[str], checker: _Checker
) -> None:
    assert importlib.util.find_spec(module) is not None, f"{command}\nno module {module}"
    if module == "jia_jax.main":
        return  # the caller checks it
    returncode, stderr = checker.run(module, args, env, True)
    assert returncode == 0, f"{command}\nits arguments are refused:\n{stderr[-3000:]}"


def _check_script(
    command: Command, env: dict[str, str], words: list[str], checker: _Checker
) -> None:
    path = REPO / words[0]
    assert path.is_file() and os.access(path, os.X_OK), (
        f"{command}\n{words[0]} is not an executable file"
    )
    result = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, f"{command}\n{result.stderr}"
    configs = [w for w in words[1:] if re.match(r"^configs/\w+\.py(:\w+)?$", w)]
    if configs and not _is_template(words):
        # The script passes the config and overrides on to the trainer.
        args = [
            f"--config={configs[0]}",
            "--workdir=/tmp/unused",
            *(w for w in words if w.startswith("--config.")),
        ]
        returncode, stderr = checker.run("jia_jax.main", [*args, "--only_check_args"], env, False)
        assert returncode == 0, f"{command}\nthe trainer refuses:\n{stderr[-3000:]}"


def test_pip_extras_named_in_the_docs_exist():
    """`pip install -e ".[x]"` installs extra x only if pyproject.toml defines it (pip merely
    warns about an unknown one)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    defined = project["optional-dependencies"]
    named = {
        (command.source, extra)
        for command in collected()[1]
        if _program(_words(command.text)) in ("pip", "pip3")
        for group in re.findall(r"\.\[([\w,-]+)\]", command.text)
        for extra in group.split(",")
    }
    assert any(extra == "tensorboard" for _, extra in named), named
    missing = [f"{source}: .[{extra}]" for source, extra in sorted(named) if extra not in defined]
    assert not missing, missing


def test_docs_hold_commands_and_snippets():
    """The collection itself: an empty list would pass everything below."""
    snippets, commands = collected()
    assert len(commands) >= 10 and snippets, (len(commands), snippets)
    assert any("jia_jax.main" in c.text for c in commands)


def test_the_checker_tells_refused_arguments_from_accepted_ones(checker):
    """What every parse-only check below relies on: a refusal comes back as a failure."""
    workdir = "--workdir=/tmp/unused"
    assert checker.run("scripts.bench.hosts", ["--hosts=2"], {}, True) == (0, "")
    returncode, stderr = checker.run("scripts.bench.hosts", ["--hostz=2"], {}, True)
    assert returncode == 2 and "unrecognized arguments: --hostz=2" in stderr, stderr
    trainer = ["--config=configs/digits.py", workdir, "--only_check_args"]
    assert checker.run("jia_jax.main", trainer, {}, False)[0] == 0
    returncode, stderr = checker.run("jia_jax.main", [*trainer, "--config.nope=1"], {}, False)
    assert returncode == 1 and "the config has no field 'nope'" in stderr, stderr
    returncode, stderr = checker.run("scripts.no_such_module", [], {}, True)
    assert returncode == 1 and "No module named scripts.no_such_module" in stderr, stderr


@pytest.mark.parametrize("page, blocks", collected()[0], ids=[p for p, _ in collected()[0]])
def test_python_snippets_run(page, blocks):
    for source, code, sketch in blocks:
        try:
            compile(code, source, "exec")
        except SyntaxError as error:
            pytest.fail(f"{source}: the snippet does not parse: {error}")
    runnable = [(source, code) for source, code, sketch in blocks if not sketch]
    # One process per page: the snippets build on each other, as a reader's session does.
    program = "\n".join(f"print({source!r}, flush=True)\n{code}" for source, code in runnable)
    result = _run([sys.executable, "-c", program], {})
    ran = [line for line in result.stdout.splitlines() if line.startswith(page)]
    assert result.returncode == 0, (
        f"{ran[-1] if ran else page}: the snippet fails:\n{result.stderr[-3000:]}"
    )


@pytest.mark.parametrize("command", collected()[1], ids=str)
def test_shell_command_works_as_pasted(command, tmp_path, checker):
    try:
        words = _words(command.text)
    except ValueError as error:
        pytest.fail(f"{command}\ndoes not parse as shell: {error}")
    if _is_template(words):
        return  # placeholders (`<workdir>`, `...`) are for the reader to fill in
    syntax = subprocess.run(["bash", "-n", "-c", command.text], capture_output=True, text=True)
    assert syntax.returncode == 0, f"{command}\n{syntax.stderr}"
    env, words = _env_and_words(command.text)
    if not words or words[0] in OTHER_TOOLS or words[0] == "bash":
        return
    if words[0].startswith("scripts/"):
        if len(words) == 1 and not words[0].endswith(".sh"):
            # A mention of a file (or `file.py:function`) in prose.
            assert (REPO / words[0].split(":")[0]).exists(), f"{command}\nno such file"
            return
        _check_script(command, env, words, checker)
        return
    if words[0] in PYTHON:
        assert len(words) >= 3 and words[1] == "-m", f"{command}\nexpected `python -m MODULE ...`"
        module, args = words[2], words[3:]
        if module in NOT_RUN_MODULES:
            return
        if not args:
            # A mention of the program in prose (`python -m scripts.x`): it must exist.
            assert importlib.util.find_spec(module) is not None, f"{command}\nno module {module}"
            return
        _check_module(command, env, module, args, checker)
        if module == "jia_jax.main":
            _check_trainer(command, env, args, tmp_path, checker)
        return
    pytest.fail(f"{command}\nunknown program {words[0]!r}: teach tests/test_doc_commands.py")
