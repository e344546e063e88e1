r"""One process driving all GPUs vs the same run split over processes by `scripts/launch_local.sh`.

Runs `python -m jia_jax.main` twice with the same config and overrides: once in one process on a
1 x n mesh, once as `--processes` processes of n / processes GPUs each (mesh processes x n/p,
NCCL between the processes), and compares the last logged loss (same data, same maths: it must
agree) and the last logged images/s (the interval after the first, which holds the compile).

  python -m scripts.bench.multiprocess --processes=2 --gpus=2 --out=/tmp/mp.json -- \
      --config=configs/resnet50_64k.py --config.data.name=synthetic \
      --config.global_batch_size=512 --config.total_steps=40 --config.log_every_steps=20 \
      --config.optimizer.warmup_epochs=0
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Sequence
from typing import Any

from scripts.bench import harness


def last_progress(log: str) -> dict[str, float]:
    """The last progress line of a trainer log: step, loss and images/s."""
    found = harness.trainer_progress(log)
    if not found:
        raise ValueError(f"no progress line in the log:\n{log[-2000:]}")
    return found[-1]


def run(command: list[str], env: dict[str, str]) -> dict[str, Any]:
    """Runs a trainer command; returns its last progress figures and the command."""
    returncode, log = harness.run_logged(command, env)
    if returncode:
        raise RuntimeError(f"{' '.join(command)} exited {returncode}:\n{log[-3000:]}")
    return {"command": " ".join(command), **last_progress(log)}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--gpus", type=int, default=2, help="GPUs in all")
    parser.add_argument("--out", default="bench_multiprocess.json")
    parser.add_argument("trainer_args", nargs="+", help="--config=... and overrides (after --)")
    args = parser.parse_args(argv)
    if args.gpus % args.processes:
        parser.error("--gpus must be a multiple of --processes")
    config = next(a.split("=", 1)[1] for a in args.trainer_args if a.startswith("--config="))
    overrides = [a for a in args.trainer_args if not a.startswith("--config=")]
    env = dict(os.environ)
    per_process = args.gpus // args.processes
    with tempfile.TemporaryDirectory() as one_dir, tempfile.TemporaryDirectory() as split_dir:
        one = run(
            [
                "python3",
                "-m",
                "jia_jax.main",
                f"--config={config}",
                f"--workdir={one_dir}",
                "--config.mesh.node=1",
                f"--config.mesh.gpu={args.gpus}",
                *overrides,
            ],
            env,
        )
        split = run(
            [
                "bash",
                "scripts/launch_local.sh",
                str(args.processes),
                str(per_process),
                config,
                split_dir,
                *overrides,
            ],
            env,
        )
    doc = {
        "environment": harness.environment(),
        "args": vars(args),
        "one_process": {**one, "mesh": f"1x{args.gpus}"},
        "processes": {**split, "mesh": f"{args.processes}x{per_process}"},
        "loss_difference": split["loss"] - one["loss"],
        "throughput_ratio": split["images_per_s"] / one["images_per_s"],
    }
    harness.write_json(args.out, doc)
    print(
        f"1 process 1x{args.gpus}: loss {one['loss']} at step {one['step']}, "
        f"{one['images_per_s']:.0f} img/s | {args.processes} processes "
        f"{args.processes}x{per_process}: loss {split['loss']}, {split['images_per_s']:.0f} img/s "
        f"| ratio {doc['throughput_ratio']:.4f}"
    )
    return doc


if __name__ == "__main__":
    main()
