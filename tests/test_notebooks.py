"""Both notebooks run top to bottom on the CPU (quick mode), so a change that breaks one fails CI."""

import os
import pathlib
import re

import nbformat
from nbclient import NotebookClient

NOTEBOOKS = pathlib.Path(__file__).resolve().parents[1] / "notebooks"
# Per cell. Quick mode runs each notebook in well under a minute on an idle 2-core CPU; the
# slowest cell (compiles plus a short training loop) takes about 20 s there.
CELL_TIMEOUT_S = 180


def execute(name: str) -> nbformat.NotebookNode:
    """Runs notebooks/<name> in a fresh kernel, in its folder, with JIA_JAX_NOTEBOOK_QUICK=1.

    An exception in any cell (the notebooks assert their own checks) fails the test here.
    """
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    # The kernel inherits this environment: conftest's XLA_FLAGS (fast CPU compiles, which the
    # notebooks keep) and the quick switch.
    env = dict(os.environ, JIA_JAX_NOTEBOOK_QUICK="1")
    client = NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOKS)}},
    )
    client.execute(env=env)
    return nb


def stream_text(cell: nbformat.NotebookNode) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


def test_quickstart_trains_on_the_mesh():
    nb = execute("quickstart.ipynb")
    final = stream_text(nb.cells[-2])
    match = re.search(r"final test top-1 ([\d.]+), top-5 ([\d.]+), loss ([\d.]+) over (\d+)", final)
    assert match, final
    top1, top5, _, examples = map(float, match.groups())
    assert examples == 360
    # 30 quick steps: above chance (0.1) by more than 6 standard deviations of a guessing
    # classifier's top-1 on 360 digits (sqrt(0.1 * 0.9 / 360) = 0.016); top-5 >= top-1.
    assert 0.2 < top1 <= top5 <= 1.0


def test_lars_and_communication_runs_its_checks():
    # Its cells assert the library's trust ratios against numpy's and the flat and hierarchical
    # strategies' means against 4.5 g; here, also that the plots were drawn.
    nb = execute("lars_and_communication.ipynb")
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert sum(o.output_type == "display_data" for o in outputs) >= 3
