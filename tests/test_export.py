"""`python -m jia_jax.main --mode=export` and `jia_jax.export.load`: a finished run's parameters
in one file, classifying on a CPU without the training state."""

import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from jia_jax import export, input_pipeline
from tests.main_util import DIGITS_RUN_FLAGS, run_main

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "workflows.md"
DOC_PATH = "/tmp/jia_jax/digits.msgpack"  # the file the doc's snippet loads


def run_doc_snippet(marker: str, replacements: dict[str, str]) -> subprocess.CompletedProcess:
    """Runs the ```python block of docs/workflows.md under the sketch comment naming `marker`,
    each key of `replacements` (the doc's paths) replaced by its value, in a fresh process with
    one CPU device: nothing of a run but the files the snippet names."""
    pattern = rf"<!-- doc-test: sketch: [^>]*{marker}[^>]*-->\n```python\n(.*?)```"
    match = re.search(pattern, DOC.read_text(), re.DOTALL)
    assert match, f"no snippet marked for {marker} in {DOC}"
    snippet = match.group(1)
    for doc_text, real in replacements.items():
        assert doc_text in snippet, doc_text
        snippet = snippet.replace(doc_text, real)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    return subprocess.run(
        [sys.executable, "-c", snippet],
        cwd=REPO,
        env={**env, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def exported(digits_run, tmp_path_factory) -> Path:
    workdir, _ = digits_run
    path = tmp_path_factory.mktemp("export") / "digits.msgpack"
    result = run_main(
        *DIGITS_RUN_FLAGS, f"--workdir={workdir}", "--mode=export", f"--export_path={path}"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    line = rf"exported the checkpoint of step 30 to {path} \([\d,]+ bytes\)$"
    assert re.search(line, result.stderr, re.MULTILINE), result.stderr[-3000:]
    return path


def test_the_docs_snippet_classifies_the_test_set_at_the_runs_accuracy_on_cpu(
    digits_run, exported
):
    _, log = digits_run
    final = float(re.search(r"final eval at step 30: top-1 ([\d.]+)", log).group(1))
    result = run_doc_snippet("tests/test_export.py", {DOC_PATH: str(exported)})
    assert result.returncode == 0, result.stderr[-3000:]
    top1 = float(re.fullmatch(r"top-1 ([\d.]+) over 360 test digits\n", result.stdout).group(1))
    # The run evaluated on 8 devices, the file on one: the same float32 maths in another order,
    # which can flip only a prediction whose two best logits tie to rounding; the log prints
    # 4 decimals (+-5e-5).
    assert abs(top1 - final) <= 1 / 360 + 5e-5, (top1, final)
    assert top1 > 0.3  # trained: chance is 0.1


def test_the_file_holds_the_checkpoints_parameters_and_statistics(digits_run, exported):
    workdir, _ = digits_run
    with ocp.StandardCheckpointer() as reader:
        state = reader.restore(workdir / "checkpoints" / "30" / "state")
    classifier = export.load(str(exported))
    assert (classifier.step, classifier.image_size, classifier.channels) == (30, 8, 1)
    assert classifier.class_names == tuple("0123456789")
    for name in ("params", "batch_stats"):
        stored = jax.tree.leaves_with_path(classifier.variables[name])
        saved = dict(jax.tree.leaves_with_path(state[name]))
        assert len(stored) == len(saved) > 0
        for path, leaf in stored:
            np.testing.assert_array_equal(leaf, np.asarray(saved[path]))
    images, _ = input_pipeline.digits_split("test", classifier.image_size)
    probabilities = classifier.probabilities(images[:5])
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-6)
    assert (probabilities.argmax(1) == classifier.predict(images[:5])).all()


def test_a_file_not_exported_is_refused_in_one_line(tmp_path):
    other = tmp_path / "other.msgpack"
    other.write_bytes(b"\x81\xa1a\x01")  # msgpack of {"a": 1}
    with pytest.raises(ValueError, match=r"is not a model exported by jia_jax \(--mode=export\)"):
        export.load(str(other))
