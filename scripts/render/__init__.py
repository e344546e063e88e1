"""One renderer for the tables of docs/*.md: a raw file of `docs/benchmarks/` (a benchmark's JSON,
or `large_batch_digits.json`) or a named table of docs/scaling.md in, the Markdown block the doc pastes out, so no number in a table is typed by hand.

  python -m scripts.render docs/benchmarks/bench_step_4xH200.json scaling:held_out

A block is `From `<source>`.`, a blank line, then the table; tests/test_docs.py re-renders every
block of the docs and finds it unchanged.
"""

from __future__ import annotations

import json


def render(source: str) -> str:
    """The block for `source`: a path of a raw file, `<overlap raw file>#schedule` (where XLA put
    each all-reduce), `<overlap raw file>#collectives` (each process's time in each collective),
    `<hosts raw file>#boundaries` (how each traced GPU's kernels followed one another),
    `<hosts raw file>#accounting` (each traced row's step as compute, exposed communication and
    idle), `<profile raw file>#bandwidth` (its kernels furthest below the memory's speed), or
    `scaling:<table name>`."""
    if source.startswith("scaling:"):
        # Imported here: the scaling tables need JAX (for parameter shapes), the others do not.
        from scripts.render import scaling  # pylint: disable=import-outside-toplevel

        name = source.removeprefix("scaling:")
        if name not in scaling.TABLES:
            raise ValueError(f"no scaling table {name!r}; choose from {sorted(scaling.TABLES)}")
        table = scaling.TABLES[name]()
    elif source.endswith("large_batch_digits.json"):
        from scripts.render import large_batch  # pylint: disable=import-outside-toplevel

        with open(source) as f:
            doc = json.load(f)
        table = large_batch.table(doc["rows"], doc["meta"]).rstrip("\n")
    elif source.endswith("#bandwidth"):
        from scripts.render import benchmarks  # pylint: disable=import-outside-toplevel

        table = benchmarks.bandwidth_table(source.removesuffix("#bandwidth"))
    else:
        from scripts.render import benchmarks  # pylint: disable=import-outside-toplevel

        path, _, view = source.rpartition("#")
        if view in benchmarks.VIEWS:
            with open(path) as f:
                table = benchmarks.VIEWS[view](json.load(f))
        else:
            table = benchmarks.table(source)
    return f"From `{source}`.\n\n{table}\n"
