"""What README.md and docs/*.md say of the shipped configs is what the configs hold.

Each fact is recomputed from the config files (strategy, wire dtype, bucket size, compute dtype,
batch and per-device pass of each config; the fields free on resume; the config keys README calls
stable), so a config change that the docs do not follow fails here. Claims of a known shape
("`configs/X.py` uses `S`", "the 64K configs send D") are checked wherever the docs make them.
"""

from __future__ import annotations

import importlib.util
import pathlib
import re

import pytest

from jia_jax import recipe
from jia_jax.models import MODEL_NAMES

REPO = pathlib.Path(__file__).resolve().parents[1]
PAGES = ["README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md"))]
LARGE = ("resnet50_64k", "alexnet_bn_64k")
# How the docs name a model and an optimizer.
MODEL_WORDS = {
    "resnet18": "ResNet-18",
    "resnet50": "ResNet-50",
    "alexnet_bn": "AlexNet with BatchNorm",
}
OPTIMIZER_WORDS = {"lars": "LARS", "sgd": "SGD"}
STRATEGIES = ("xla", "flat", "hierarchical", "hybrid", "auto")
DTYPE = {"bf16": "bfloat16", "fp32": "float32", "fp16": "float16"}  # the docs' short names


def wire_is(name: str, wire: str) -> bool:
    return config(name).comm.dtype == DTYPE.get(wire, wire)


def config(name: str):
    """`configs/<name>.py`'s config, loaded from its file as `--config=` does."""
    path = REPO / "configs" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"doc_fact_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def flat_text(page: str) -> str:
    return " ".join((REPO / page).read_text().split())  # the docs wrap lines anywhere


def mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:g} MiB"


def readme_row(name: str) -> str:
    rows = [
        line
        for line in (REPO / "README.md").read_text().splitlines()
        if line.startswith(f"| `configs/{name}.py` |")
    ]
    assert len(rows) == 1, f"README's config table has {len(rows)} rows for configs/{name}.py"
    return rows[0]


@pytest.mark.parametrize("name", ["digits", "default", *LARGE])
def test_readme_config_table_states_each_configs_values(name):
    c = config(name)
    facts = [
        MODEL_WORDS[c.model.name],
        f"global batch {c.global_batch_size:,}",
        OPTIMIZER_WORDS[c.optimizer.name],
        f"{c.precision.compute} compute",
    ]
    if "width" in c.model:
        facts.append(f"(width {c.model.width})")
    if c.microbatch_size:
        facts.append(f"per-device passes of {c.microbatch_size}")
    if name != "digits":  # digits runs on one CPU process; its row does not describe the wire
        facts.append(
            f"all-reduce `{c.comm.strategy}` in {mib(c.comm.bucket_bytes)} buckets, "
            f"{c.comm.dtype} on the wire"
        )
    row = readme_row(name)
    missing = [f for f in facts if f not in row]
    assert not missing, f"configs/{name}.py holds {missing}; README's row says: {row}"


def test_what_the_docs_say_of_both_64k_configs_holds_for_both():
    r50, alex = config("resnet50_64k"), config("alexnet_bn_64k")
    # The docs speak of "the 64K configs" together only for what they share.
    assert r50.comm.dtype == alex.comm.dtype
    assert r50.comm.bucket_bytes == alex.comm.bucket_bytes
    assert r50.precision.compute == alex.precision.compute
    wire = r50.comm.dtype
    [short] = [k for k, v in DTYPE.items() if v == wire]
    quotes = {
        "README.md": [f"the 64K configs send {wire}"],
        "docs/scaling.md": [f"the 64K configs send {wire} (their `comm.dtype`)"],
        "docs/benchmarks.md": [
            f"plan of both 64K configs on one host ({mib(r50.comm.bucket_bytes)} buckets, "
            f"{short} wire)"
        ],
    }
    for page, wanted in quotes.items():
        missing = [q for q in wanted if q not in flat_text(page)]
        assert not missing, f"{page} does not say what the configs hold: {missing}"


# Claims of a known shape, wherever a page makes them: (pattern, check of its groups, what).
CLAIMS = [
    (
        r"`configs/(\w+)\.py` uses `(\w+)`",
        lambda name, strategy: strategy not in STRATEGIES or config(name).comm.strategy == strategy,
        "comm.strategy",
    ),
    (
        r"the 64K configs send (\w+)",
        lambda wire: all(wire_is(n, wire) for n in LARGE),
        "comm.dtype",
    ),
    (
        r"`(\w+)` is the 64K configs' default",
        lambda strategy: all(config(n).comm.strategy == strategy for n in LARGE),
        "comm.strategy",
    ),
    (
        r"(\w+),? \(?the 64K configs' `comm\.dtype`",
        lambda wire: all(wire_is(n, wire) for n in LARGE),
        "comm.dtype",
    ),
]


def test_claims_about_the_configs_hold_wherever_the_docs_make_them():
    found, wrong = 0, []
    for page in PAGES:
        text = flat_text(page)
        for pattern, holds, field in CLAIMS:
            for match in re.finditer(pattern, text):
                found += 1
                if not holds(*match.groups()):
                    wrong.append(f"{page}: '{match.group(0)}' ({field} differs)")
    assert not wrong, wrong
    assert found >= 4, f"only {found} claims found: the patterns no longer match the docs"


def test_readme_lists_exactly_the_fields_free_on_resume():
    text = flat_text("README.md")
    sentence = text.split("may change freely:")[1].split(";")[0]
    listed = set(re.findall(r"`([\w.*]+)`", sentence))
    assert listed == set(recipe.FREE_ON_RESUME), (
        f"README lists {sorted(listed - set(recipe.FREE_ON_RESUME))} that recipe.FREE_ON_RESUME "
        f"does not, and misses {sorted(set(recipe.FREE_ON_RESUME) - listed)}"
    )


def _has(node, path: str) -> bool:
    for part in path.split("."):
        if part not in node:
            return False
        node = node[part]
    return True


def test_readme_stable_config_keys_exist_and_name_real_choices():
    readme = flat_text("README.md")
    paragraph = readme.split("Config keys that stay stable:")[1].split("A 64K batch")[0]
    names = re.findall(r"`([^`]+)`", paragraph)
    base = config("default")
    key = r"[a-z_]+(\.[a-z_]+)+|[a-z_]+_(size|steps|epochs)|seed"
    keys = [n for n in names if re.fullmatch(key, n)]
    missing = [k for k in keys if not _has(base, k)]
    assert len(keys) >= 15 and not missing, (keys, missing)
    # The model names it offers are the ones `create_model` accepts.
    [resnets] = [n for n in names if n.startswith("resnet") and "|" in n]
    offered = {f"resnet{d}" for d in resnets.removeprefix("resnet").split("|")} | {"alexnet_bn"}
    assert offered == set(MODEL_NAMES)


def test_readme_comm_options_table_states_each_default():
    """Each row of README's table of `comm` options: its default in configs/default.py, and
    where the 64K configs differ, what they hold, by name; each but the wire's dtype free to
    change on resume, as the README says."""
    rows = dict(re.findall(r"^\| `comm\.(\w+)` \| ([^|]+) \|", (REPO / "README.md").read_text(),
                           re.MULTILINE))

    def say(value) -> str:
        if isinstance(value, bool):
            return "on" if value else "off"
        if isinstance(value, int):
            return f"{value // 2**20} MiB" if value else "0"
        return f"`{value}`"

    assert len(rows) >= 10
    free = {f for f in rows if f"comm.{f}" in recipe.FREE_ON_RESUME}
    assert set(rows) - free == {"dtype"}
    for field, cell in rows.items():
        assert cell.startswith(say(config("default").comm[field])), (field, cell)
        large = {n: config(n).comm[field] for n in LARGE}
        if len(set(large.values())) == 1 and large["resnet50_64k"] != config("default").comm[field]:
            assert f"({say(large['resnet50_64k'])} in the 64K configs)" in cell, (field, cell)
        elif large["resnet50_64k"] != config("default").comm[field]:
            assert f"({say(large['resnet50_64k'])} in the ResNet-50 64K config)" in cell, field
        else:
            assert "64K" not in cell, (field, cell)
