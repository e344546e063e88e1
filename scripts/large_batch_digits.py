r"""Large-batch study on digits: batch-64 SGD vs batch-512 SGD (with/without warmup) and LARS.

Trains every recipe of `configs/digits_large_batch.py` for each seed through
`jia_jax.loop.train_and_evaluate` on a simulated 2x4 CPU mesh, then prints a markdown table of the
final test top-1 with the command, commit and machine under it, and writes that (`--table`) and
every run's result (`--json`).

Run from the repository root:

  python -m scripts.large_batch_digits --seeds=0,1,2 \
      --table=docs/benchmarks/large_batch_digits_table.md \
      --json=docs/benchmarks/large_batch_digits.json

`--set RECIPE:FIELD=VALUE` (repeatable) overrides a config field of one recipe for a tuning
sweep, e.g. `--recipes=large_lars --set=large_lars:optimizer.base_learning_rate=2.0`.

The simulated CPU devices are set up here (XLA_FLAGS, JAX_PLATFORMS=cpu), so the study runs the
same on any machine.
"""

import os

# The simulated devices must exist before jax is imported.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import ast  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import ml_collections  # noqa: E402

from configs import digits_large_batch  # noqa: E402
from jia_jax import input_pipeline  # noqa: E402
from jia_jax import loop  # noqa: E402
from jia_jax import mesh as mesh_lib  # noqa: E402
from scripts.render import large_batch  # noqa: E402


def parse_overrides(items: list[str]) -> dict[str, dict[str, object]]:
    """`recipe:a.b=value` strings to {recipe: {"a.b": value}}; values are Python literals."""
    overrides: dict[str, dict[str, object]] = {}
    for item in items:
        target, _, value = item.partition("=")
        recipe, _, key = target.partition(":")
        if not key or not value or recipe not in digits_large_batch.RECIPES:
            raise ValueError(
                f"--set {item!r}: expected RECIPE:FIELD=VALUE with RECIPE one of "
                f"{digits_large_batch.RECIPES}."
            )
        try:
            parsed = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            parsed = value
        overrides.setdefault(recipe, {})[key] = parsed
    return overrides


def recipe_config(
    recipe: str, seed: int, overrides: dict[str, object]
) -> ml_collections.ConfigDict:
    config = digits_large_batch.get_config(recipe)
    config.seed = seed
    for key, value in overrides.items():
        *path, leaf = key.split(".")
        node = config
        for part in path:
            node = node[part]
        node[leaf] = value
    return config


def run(config: ml_collections.ConfigDict) -> dict[str, float]:
    """One training run in a throw-away workdir: final test top-1, last train loss, wall time."""
    with tempfile.TemporaryDirectory() as workdir:
        start = time.perf_counter()
        results = loop.train_and_evaluate(config, workdir)
        seconds = time.perf_counter() - start
    return {
        "eval_top1": results["eval/top1"],
        "train_loss": results["train/loss"],
        "seconds": seconds,
    }


def describe(config: ml_collections.ConfigDict, num_train: int) -> dict[str, object]:
    opt = config.optimizer
    return {
        "batch": config.global_batch_size,
        "optimizer": opt.name,
        "peak_lr": opt.learning_rate,
        "trust_coefficient": opt.trust_coefficient if opt.name == "lars" else None,
        "warmup_epochs": opt.warmup_epochs,
        "decay": f"{opt.decay}" + (f"^{opt.power:g}" if opt.decay == "poly" else ""),
        "epochs": config.num_epochs,
        "steps": loop.total_steps(config, num_train),
    }


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    except OSError:
        names = []
    return names[0] if names else platform.machine()


def provenance() -> dict[str, str]:
    """The command line, the commit (marked if the code it ran differs from it) and the machine."""
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    changed = subprocess.run(
        [
            "git",
            "status",
            "--porcelain",
            "--",
            "jia_jax",
            "configs",
            "scripts/large_batch_digits.py",
        ],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split("\n")
    changed = [line[3:] for line in changed if line.strip()]
    if changed:
        commit += " + uncommitted " + ", ".join(changed)
    cpu = f"{_cpu_model()}, {os.cpu_count()} CPU cores"
    return {
        "command": "python -m scripts.large_batch_digits " + " ".join(sys.argv[1:]),
        "commit": commit,
        "machine": f"{cpu}; {jax.device_count()} simulated {jax.devices()[0].platform} devices, "
        f"jax {jax.__version__}",
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--recipes", default=",".join(digits_large_batch.RECIPES))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument(
        "--set", action="append", default=[], dest="overrides", metavar="RECIPE:FIELD=VALUE"
    )
    parser.add_argument("--table", help="write the markdown table here")
    parser.add_argument("--json", help="write every run's result here")
    args = parser.parse_args()

    recipes = args.recipes.split(",")
    seeds = [int(s) for s in args.seeds.split(",")]
    overrides = parse_overrides(args.overrides)
    data = digits_large_batch.get_config().data
    num_train = input_pipeline.create_input(data, 64, 64, mesh_lib.create_mesh(), 0).info.num_train

    rows, runs = [], []
    for recipe in recipes:
        top1, seconds = [], []
        for seed in seeds:
            config = recipe_config(recipe, seed, overrides.get(recipe, {}))
            result = run(config)
            print(
                f"{recipe} seed {seed}: test top-1 {100 * result['eval_top1']:.2f}%, "
                f"train loss {result['train_loss']:.4f}, {result['seconds']:.0f} s",
                flush=True,
            )
            runs.append({"recipe": recipe, "seed": seed, **result})
            top1.append(result["eval_top1"])
            seconds.append(result["seconds"])
        rows.append(
            {
                "recipe": recipe,
                **describe(config, num_train),
                "top1": top1,
                "mean_top1": statistics.mean(top1),
                "std_top1": statistics.stdev(top1) if len(top1) > 1 else 0.0,
                "mean_seconds": statistics.mean(seconds),
            }
        )

    meta = provenance()
    table = large_batch.table(rows, meta)
    print(table)
    if args.table:
        with open(args.table, "w") as f:
            f.write(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"meta": {**meta, "overrides": overrides}, "rows": rows, "runs": runs}, f, indent=2
            )


if __name__ == "__main__":
    main()
