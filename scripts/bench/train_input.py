r"""Images/s of `python -m jia_jax.main` on real JPEGs against the same run on synthetic data.

Each variant is one training run of the ResNet-50 64K config (bf16, `per_gpu` images per GPU, all
visible GPUs), with checkpoints and mid-run evals off, in one child process or, with
`--processes=P`, in P of them started by `scripts/launch_local.sh` (GPUs / P each, the host's
first GPUs, joined by jax.distributed; NCCL between them, over NVLink where the GPUs have it) or,
with `--launcher=main` and P the visible GPUs, by `python -m jia_jax.main` itself where its
`distributed.process_per_gpu` (the config's, "auto" by default; "never" in one process) says so,
the processes it started recorded as `started` (1: it trained alone):
  * `synthetic`: images made on the device (no input cost): the step's own speed;
  * `host`: the tfds dataset written by `scripts/bench/input.py` (ArrayRecord, 500x375 JPEGs),
    decoded and augmented by `data.num_workers` worker processes, uint8 to the device;
  * `gpu`: the same dataset decoded and augmented on the GPUs (`data.decode=gpu`, nvImageCodec),
    its records read by `data.num_workers` worker processes.
The rate of a run is the median of the trainer's own logged images/s (the global rate, which
every process logs: counted once) over the logging intervals after the first (which holds
compilation and the workers' start); its `input_wait` is the median, over the same intervals,
of the logged fraction of time the loop waited for the next batch. With `--thread_cpu`, its
`thread_cpu` is where the trainer's CPU went over the same intervals (scripts/bench/thread_cpu.py:
CPU seconds a second by thread name, and of its worker processes). `--xla_flags` are appended
to the trainers' XLA_FLAGS only. With `--command_buffer_log`, its `command_buffer_updates` are
XLA's own account of the step's command-buffer updates over the same intervals
(scripts/bench/command_buffer_log.py). With `--gc_log`, its `gc_pauses` are the passes of the
trainer's garbage collector per generation over the same intervals (scripts/bench/gc_pauses.py;
with `--gc_unfrozen` the trainer as it ran before it froze what it built). Writes JSON with each
run's command, log tail and ratio to `synthetic`.

  python -m scripts.bench.input --data_dir=/tmp/jia_bench_data --cores 16   # writes the dataset
  python -m scripts.bench.train_input --data_dir=/tmp/jia_bench_data --num_workers=15 \
      --out=/tmp/bench_train_input.json
  python -m scripts.bench.train_input --data_dir=/tmp/jia_bench_data --variants=synthetic,gpu \
      --num_workers=4 --out=/tmp/bench_train_input_gpu.json    # needs pip install -e ".[gpu]"
  python -m scripts.bench.train_input --data_dir=/tmp/jia_bench_data --variants=gpu \
      --processes=2 --num_workers=16 --out=/tmp/bench_train_input_gpu_2proc.json  # 2 GPUs
  python -m scripts.bench.train_input --data_dir=/tmp/jia_bench_data --variants=gpu \
      --processes=2 --launcher=main --num_workers=16 --out=/tmp/bench_train_input_gpu_main.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from scripts.bench import command_buffer_log, gc_pauses, harness, thread_cpu

VARIANTS = ("synthetic", "host", "gpu")
DECODE = {"host": "cpu", "gpu": "gpu"}


def command(variant: str, args: argparse.Namespace, gpus: int, workdir: str) -> list[str]:
    """The trainer's command line of one variant on `gpus` GPUs: `jia_jax.main`, or with
    `args.processes` > 1 the local launcher of that many (it sets the mesh and the processes'
    distributed flags itself) unless `args.launcher` is "main" (main starts them)."""
    flags = config_flags(variant, args, gpus)
    if args.processes == 1 or args.launcher == "main":
        trainer = ["-m", "jia_jax.main", f"--config={args.config}", f"--workdir={workdir}"]
        if args.gc_log:  # one process (main() checks): the wrapper times its collector
            timer = ["-m", "scripts.bench.gc_pauses", f"--out={gc_file(workdir)}"]
            trainer = [*timer, *(["--unfrozen"] if args.gc_unfrozen else []), "--", *trainer]
        return [sys.executable, *trainer, *flags]
    per_process = str(gpus // args.processes)
    launcher = ["scripts/launch_local.sh", str(args.processes), per_process, args.config, workdir]
    return ["bash", *launcher, *flags]


def gc_file(workdir: str) -> str:
    """Where a run's trainer, wrapped by scripts/bench/gc_pauses.py, writes its collector's
    passes."""
    return os.path.join(workdir, "gc_pauses.json")


def config_flags(variant: str, args: argparse.Namespace, gpus: int) -> list[str]:
    """The `--config.*` flags of one variant on `gpus` GPUs in all."""
    workers_split = 1 if args.launcher == "main" else args.processes  # main shares them out
    cmd = [
        f"--config.global_batch_size={args.per_gpu * gpus}",
        f"--config.microbatch_size={args.per_gpu}",
        f"--config.total_steps={args.steps}",
        f"--config.log_every_steps={args.log_every}",
        "--config.optimizer.warmup_epochs=0",
        "--config.checkpoint_every_steps=1000000",
        "--config.eval_every_steps=1000000",
    ]
    if args.processes == 1:  # one process, as the record says, wherever the data is decoded
        cmd.append("--config.distributed.process_per_gpu=never")
    cmd += args.override
    if variant == "synthetic":
        return [*cmd, "--config.data.name=synthetic"]
    return [
        *cmd,
        "--config.data.name=jia_bench_jpeg",
        f"--config.data.decode={DECODE[variant]}",
        f"--config.data.data_dir={os.path.join(args.data_dir, 'array_record')}",
        f"--config.data.num_workers={args.num_workers // workers_split}",
        # The generated dataset has one split; the final eval reads a slice of it.
        "--config.data.eval_split=train[:10%]",
        f"--config.eval_batch_size={args.per_gpu * gpus}",
    ]


def run(variant: str, args: argparse.Namespace, gpus: int) -> dict[str, Any]:
    """One training run; its steady images/s and input wait (medians of the intervals after the
    first)."""
    workdir = tempfile.mkdtemp(prefix=f"jia_jax_{variant}_")
    cmd = command(variant, args, gpus, workdir)
    samples: list[thread_cpu.Sample] = []

    def look(pid: int) -> None:
        samples.append(thread_cpu.sample(pid, time.time()))

    each_second = look if args.thread_cpu else None
    env = {**args.child_env, **(command_buffer_log.ENV if args.command_buffer_log else {})}
    returncode, log = harness.run_logged(
        cmd, env=env, timeout=args.timeout_s, each_second=each_second
    )
    row: dict[str, Any] = {
        "variant": variant,
        "command": " ".join(cmd[1:]),
        "returncode": returncode,
    }
    row["log_tail"] = log.splitlines()[-12:]
    if args.launcher == "main" and args.processes > 1:
        started = re.search(r"Training as (\d+) processes of one GPU each", log)
        row["started"] = int(started.group(1)) if started else 1
    progress = harness.trainer_progress(log)
    row["intervals"] = [(p["step"], p["images_per_s"]) for p in progress]
    if returncode or len(progress) < 2:
        row["error"] = "the run failed or logged fewer than two intervals"
        return row
    row["images_per_s"] = statistics.median(p["images_per_s"] for p in progress[1:])
    row["input_wait"] = steady_median(progress, "input_wait")
    launch_ms = steady_median(progress, "launch_ms")  # the host's ms a step in the step's call
    if launch_ms is not None:
        row["launch_ms"] = launch_ms
    if args.command_buffer_log:  # the steps of the intervals after the first
        updates = command_buffer_log.summary(log, progress[-1]["step"] - progress[0]["step"])
        row["command_buffer_updates"] = updates
    stages = [p["input_stages_ms"] for p in progress[1:] if "input_stages_ms" in p]
    if stages:  # the GPU path's input thread: its median wait a batch per stage
        row["input_stages_ms"] = {k: statistics.median(s[k] for s in stages) for k in stages[0]}
    if args.gc_log and os.path.exists(gc_file(workdir)):
        with open(gc_file(workdir), encoding="utf-8") as f:
            row["gc_pauses"] = gc_pauses.summary(json.load(f)["pauses"], log)
    window = thread_cpu.steady_window(samples, log)
    if window:
        first, last = window
        row["thread_cpu"] = {
            "window_s": last.wall - first.wall,
            "cpu_s_per_s": thread_cpu.shares(first, last),
        }
    return row


def steady_median(progress: Sequence[dict[str, Any]], field: str) -> float | None:
    """Median of `field` (e.g. the input-wait fraction) over the intervals after the first (those
    of the rate); None if their lines have no such field (a trainer from before it was logged)."""
    values = [p[field] for p in progress[1:] if p.get(field) is not None]
    return statistics.median(values) if values else None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data_dir", default="/tmp/jia_bench_data")
    parser.add_argument("--config", default="configs/resnet50_64k.py")
    parser.add_argument(
        "--override", action="append", default=[], help="extra --config.x=y flags; repeatable"
    )
    parser.add_argument(
        "--variants", default="synthetic,host", help=f"comma-separated, of {', '.join(VARIANTS)}"
    )
    parser.add_argument(
        "--num_workers",
        type=int,
        default=max((os.cpu_count() or 2) - 1, 1),
        help="input worker processes in all: each training process gets num_workers // processes",
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=1,
        help="training processes (scripts/launch_local.sh), of GPUs / processes each",
    )
    parser.add_argument(
        "--launcher",
        choices=("launch_local", "main"),
        default="launch_local",
        help="what starts --processes > 1: scripts/launch_local.sh, or python -m jia_jax.main "
        "itself (a process per GPU: --processes must be the visible GPUs)",
    )
    parser.add_argument("--per_gpu", type=int, default=256)
    parser.add_argument("--steps", type=int, default=240)
    parser.add_argument("--log_every", type=int, default=40)
    parser.add_argument("--timeout_s", type=float, default=400)
    parser.add_argument(
        "--thread_cpu",
        action="store_true",
        help="sample the trainer's threads (one process only): CPU seconds a second of each",
    )
    parser.add_argument(
        "--xla_flags",
        default="",
        help="appended to XLA_FLAGS for the trainers only, e.g. a command-buffer setting",
    )
    parser.add_argument(
        "--command_buffer_log",
        action="store_true",
        help="have XLA log the step's command-buffer updates; each run's figures a step after "
        "its first interval (scripts/bench/command_buffer_log.py)",
    )
    parser.add_argument(
        "--gc_log",
        action="store_true",
        help="time the trainer's garbage-collector passes (one process only; "
        "scripts/bench/gc_pauses.py): each run's per generation over its steady window",
    )
    parser.add_argument(
        "--gc_unfrozen",
        action="store_true",
        help="with --gc_log: the trainer's gc.freeze does nothing (as it trained before it froze)",
    )
    parser.add_argument("--out", default="bench_train_input.json")
    return parser


def _visible_gpus() -> int:
    """The devices JAX sees here, looked at without taking their memory (the children need it)."""
    own_env = dict(os.environ)
    os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    try:
        import jax

        return jax.local_device_count()  # the backend reads the setting here, once
    finally:
        # Not left to whatever runs in this process later (main() is also called in-process).
        os.environ.clear()
        os.environ.update(own_env)


def _print_rows(rows: list[dict[str, Any]]) -> None:
    """Each run's rate, its ratio to the synthetic run, its input wait and busiest threads."""
    # jia_jax imports JAX: here, not at the top, where it would precede _visible_gpus' setting.
    from jia_jax import stage_clock  # pylint: disable=import-outside-toplevel

    for r in rows:
        wait = "?" if r.get("input_wait") is None else f"{r['input_wait']:.0%}"
        stages = stage_clock.describe(r.get("input_stages_ms", {}))
        wait += f" ({stages} ms a batch)" if stages else ""
        print(
            f"{r['variant']:<10} {r.get('images_per_s', float('nan')):>9.1f} img/s  "
            f"ratio {r.get('ratio_vs_synthetic', float('nan')):.3f}  input wait {wait}  "
            f"{r.get('error', '')}"
        )
        if "thread_cpu" in r:  # the busiest few
            busiest = itertools.islice(r["thread_cpu"]["cpu_s_per_s"].items(), 6)
            print("  CPU s/s: " + ", ".join(f"{name} {share:.2f}" for name, share in busiest))


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = _parser().parse_args(argv)
    if args.thread_cpu and args.processes != 1:
        sys.exit("--thread_cpu samples one trainer process: use it with --processes=1")
    if args.gc_log and args.processes != 1:
        sys.exit("--gc_log times one trainer process: use it with --processes=1")
    if args.gc_unfrozen and not args.gc_log:
        sys.exit("--gc_unfrozen is a setting of --gc_log's wrapper: give both")
    args.child_env = dict(os.environ)
    if args.xla_flags:
        args.child_env["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {args.xla_flags}"
    gpus = _visible_gpus()
    if args.processes < 1 or gpus % args.processes:
        sys.exit(f"--processes={args.processes}: must divide the {gpus} visible GPUs")
    if args.launcher == "main" and args.processes not in (1, gpus):
        sys.exit(f"--launcher=main starts a process per GPU: give --processes={gpus}")
    environment = {**harness.environment(), "cpu_count": os.cpu_count()}
    # The cores this process (and so its children) may run on: fewer than the host's under taskset.
    cores = len(os.sched_getaffinity(0))
    rows = [run(v, args, gpus) for v in args.variants.split(",")]
    base = next((r for r in rows if r["variant"] == "synthetic" and "images_per_s" in r), None)
    for r in rows:
        if base and "images_per_s" in r:
            r["ratio_vs_synthetic"] = r["images_per_s"] / base["images_per_s"]
    _print_rows(rows)
    doc = {
        "environment": environment,
        "command": " ".join(sys.argv),
        "gpus": gpus,
        "processes": args.processes,
        "launcher": args.launcher if args.processes > 1 else None,
        "cores": cores,
        "args": {k: v for k, v in vars(args).items() if k != "child_env"},
        "results": rows,
    }
    harness.write_json(args.out, doc)
    return doc


if __name__ == "__main__":
    main()
