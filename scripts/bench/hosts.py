r"""The trainer across emulated hosts against the trainer on one GPU, in one run.

Each row runs `python -m jia_jax.main` (the ResNet-50 64K config, or with `--tiny` the digits
one, on synthetic data, the per-device batch as one microbatch) as `--hosts` processes of
`--gpus_per_host` GPUs started by `scripts/launch_local.sh --hosts`: each process a host of its
own to NCCL (TCP sockets between them, NVLink inside each), a cluster on one machine. The baseline is the same command on one GPU,
in the same run. Rates are the trainer's own logged images/s (one step in flight ahead, what
training sees): the median over the logged intervals after the first (which holds the compile),
each row keeping those intervals' rates (`logged_images_per_s`).
Each row records what the trainer logged it told XLA's latency estimator (`told`; "" where it
told nothing: `comm.tell_xla_network`).

  weak-scaling efficiency = images/s on hosts x gpus / (hosts x gpus x images/s on one GPU)

`--xla_flags_variant` adds a row of the config's own strategy with those XLA flags appended;
`--row_variant` one with config overrides appended and/or the trainer run from another checkout
(`source=DIR`: a directory holding that commit's `jia_jax/`, `configs/` and `scripts/`, e.g.
`git worktree add DIR COMMIT`), for a change's before and after in one run:

  python -m scripts.bench.hosts --hosts=2 --gpus_per_host=1 --batches=256 \
      --row_variant=--config.distributed.watch_peers=false --row_variant=source=/tmp/before

`--rounds=N` runs all of those rows N times in turn, each round against a one-GPU row of its own
and its rows tagged `run`: the emulated link drifts within a call, so compare a round's rows.

`--peer` adds the plain peer on the same layout (`scripts/bench/overlap.py`'s `peer`: the trainer's
forward/backward and update with the buckets reduced after backward), timed in-process by that
script in the same call, its efficiency against that script's one-GPU step. `--in_process` names
more of that script's variants to time so (`--peer` is `--in_process=peer`), e.g. `overlap_cap`,
the step the trainer compiles across hosts, to set the trainer's loop against its own step; with
`--in_process_network=emulated` that script tells XLA the network as the trainer does:

  python -m scripts.bench.hosts --hosts=2 --gpus_per_host=1 --batches=64 \
      --in_process=overlap_cap,peer --in_process_network=emulated

With `--profile_strategies`, those rows also trace `--profile_steps` steps after the timed ones
(`config.profile`) and report, per GPU and step, the NCCL time no compute kernel overlaps
(`exposed_comm_ms`) and the time no kernel runs (`idle_ms`), averaged over the GPUs, the same
over the traced steps after the first (`steady`: each process starts its trace on its own, so
the first traced step's collectives wait for the last to start), and each
process's host time in the step's calls (`launch_ms`), with what the first spends it on
(`launch`: scripts/bench/host_trace.py).

  python -m scripts.bench.hosts --hosts=2 --gpus_per_host=2 --batches=256,64 \
      --strategies=default,flat,hierarchical,hybrid,xla,auto --out=/tmp/bench_hosts.json

On CPU (tiny model, gloo; the NCCL settings are inert there):

  JIA_JAX_PLATFORM=cpu python -m scripts.bench.hosts --hosts=2 --gpus_per_host=2 --batches=2 \
      --strategies=default,flat --steps=6 --log_every=2 --tiny --out=/tmp/bench_hosts.json

`--override` (repeatable) appends a `--config.*` flag to every row's trainer, the one-GPU row's
too, e.g. `--override=--config.model.name=alexnet_bn` for a model that compiles faster.
"""

from __future__ import annotations

import argparse
import glob
import itertools
import json
import os
import re
import statistics
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

from jia_jax import xla_network
from scripts.bench import harness, host_trace, profile_trace

DEFAULT = "default"  # the config's own comm settings


def steady_rate(log: str) -> tuple[float, float, list[float]]:
    """Median images/s over the logged intervals after the first, the last loss, and those
    intervals' images/s (kept in the rows: the median alone hides a run that swung)."""
    found = harness.trainer_progress(log)
    if len(found) < 2:
        raise ValueError(f"fewer than two progress lines in the log:\n{log[-3000:]}")
    rates = [p["images_per_s"] for p in found[1:]]
    return statistics.median(rates), found[-1]["loss"], rates


def logged_launch_ms(log: str) -> list[float]:
    """The host's ms a step in the step's call over each logged interval after the first, where
    the trainer logged it: a loop whose launch nears the step's time sets the pace itself."""
    return [p["launch_ms"] for p in harness.trainer_progress(log)[1:] if "launch_ms" in p]


def profile_first_step(args: argparse.Namespace) -> int:
    """The first traced step (`config.profile.first_step`, the loop's 0-based step index):
    after the last timed step's progress line. The loop logs a step `loop.METRICS_LAG` steps
    after dispatching it, and starting the trace waits for every step dispatched, which a timed
    interval must not hold (traced from index `--steps` + 1, the interval to step `--steps`
    held it: docs/benchmarks/bench_hosts_release_2x1_2xH200.json's last rates)."""
    from jia_jax import loop

    return args.steps + loop.METRICS_LAG


def timed_lines(log: str) -> str:
    """The trainer's log up to its trace's start: the progress lines after it hold the wait
    for the steps in flight, the trace's start and the traced steps."""
    from jia_jax import loop

    return log.split(loop.TRACE_STARTS)[0]


def after_timed(args: argparse.Namespace) -> int:
    """Steps a profiled row runs after the timed ones: up to its trace, the traced steps, and
    the one before which the loop stops the trace."""
    return profile_first_step(args) - args.steps + args.profile_steps + 1


def trainer_args(args: argparse.Namespace, batch: int, devices: int, strategy: str) -> list[str]:
    """Config and overrides of one row (without the launcher's own flags)."""
    out = [
        f"--config=configs/{'digits' if args.tiny else 'resnet50_64k'}.py",
        "--config.data.name=synthetic",
        f"--config.global_batch_size={batch * devices}",
        f"--config.microbatch_size={batch}",
        f"--config.total_steps={args.steps + (after_timed(args) if args.profile_steps else 0)}",
        f"--config.log_every_steps={args.log_every}",
        "--config.optimizer.warmup_epochs=0",
        "--config.checkpoint_every_steps=100000",
        "--config.eval_every_steps=100000",
        *args.override,
    ]
    if strategy != DEFAULT:
        out.append(f"--config.comm.strategy={strategy}")
    if strategy == "auto":
        out += ["--config.comm.bucket_bytes=-1", "--config.comm.hybrid_crossover_bytes=-1"]
    return out


def told(log: str) -> str:
    """What the trainer's log says it told XLA's latency estimator (`comm.tell_xla_network`),
    or "" where it told nothing."""
    found = re.search(re.escape(xla_network.TOLD_LOG) + r"(\S+)", log)
    return found.group(1) if found else ""


def run(command: list[str], env: dict[str, str], cwd: str | None = None) -> str:
    returncode, log = harness.run_logged(command, env, cwd=cwd)
    if returncode:
        raise RuntimeError(f"{' '.join(command)} exited {returncode}:\n{log[-3000:]}")
    return log


def profile_figures(workdir: str, steps: int) -> dict[str, Any]:
    """Over the `steps` traced steps of each process: exposed NCCL time, idle time, time some
    compute kernel runs, the span of the traced steps and the kernels' time by kind (`busy_ms`:
    which kinds run longer across hosts than on one GPU), per step (ms), averaged over every traced
    GPU; how the kernels of each traced GPU's compute stream follow one another
    (`boundaries`, profile_trace.stream_boundaries, by process then GPU); and each process's
    host time in the step's calls per step (`launch_ms`) with what process 0's spends it on
    (`launch`, host_trace.breakdown); and the same exposed, idle, compute and span times over
    the traced steps after the first (`steady`: profile_trace.after_first_step; None where a
    GPU's trace does not split into steps), which leave out the processes' start apart."""
    per_gpu, steady, boundaries, launch_ms, launch = [], [], [], [], None
    for log_dir in sorted(glob.glob(os.path.join(workdir, "profile", "process_*"))):
        events = profile_trace.load_events(log_dir)
        for device_kernels in profile_trace.device_kernels(events).values():
            per_gpu.append(profile_trace.summarize(device_kernels, steps=steps))
            later = profile_trace.after_first_step(device_kernels, steps)
            steady.append(profile_trace.summarize(later, steps=steps - 1) if later else None)
            boundaries.append(profile_trace.stream_boundaries(device_kernels, steps))
        host = host_trace.breakdown(events, steps, call=host_trace.TRAIN_STEP_CALLS, n=8)
        launch_ms.append(host["call_us_per_step"] / 1000)
        launch = launch or host
    if not per_gpu:
        raise ValueError(f"no trace under {workdir}/profile")

    def mean_ms(key: str, summaries: list[dict[str, float]] = per_gpu) -> float:
        return statistics.mean(s[key] for s in summaries) / 1000

    times = {"exposed_comm_ms": "collective_exposed_us", "idle_ms": "idle_us",
             "compute_ms": "compute_us", "span_ms": "span_us"}
    return {**{name: mean_ms(key) for name, key in times.items()},
            "busy_ms": {kind: mean_ms(f"busy_{kind}_us") for kind in profile_trace.COMPUTE_KINDS},
            "steady": None if None in steady else {
                "steps": steps - 1, **{name: mean_ms(key, steady) for name, key in times.items()}},
            "boundaries": boundaries, "launch_ms": launch_ms, "launch": launch}


def parse_row_variant(spec: str) -> dict[str, Any]:
    """`--row_variant`'s space-separated items: `source=DIR`, `--config.*` overrides and
    `NAME=VALUE` environment variables (upper-case names, e.g. NCCL's settings) for the row's
    processes."""
    row: dict[str, Any] = {"overrides": []}
    for item in spec.split():
        if re.fullmatch(r"[A-Z][A-Z0-9_]*=\S*", item):
            name, value = item.split("=", 1)
            row.setdefault("env", {})[name] = value
        elif item.startswith("source="):
            row["source"] = os.path.abspath(item.split("=", 1)[1])
            if not os.path.isfile(os.path.join(row["source"], "jia_jax", "main.py")):
                raise ValueError(f"--row_variant {spec!r}: no jia_jax/main.py under {item}")
        elif item.startswith("--config."):
            row["overrides"].append(item)
        else:
            raise ValueError(
                f"--row_variant {spec!r}: {item!r} is none of source=DIR, --config.* and "
                "NAME=VALUE"
            )
    return row


def host_row(
    args: argparse.Namespace,
    batch: int,
    strategy: str,
    env: dict[str, str],
    variant: dict[str, Any] | None = None,
) -> dict:
    """One row on `--hosts` x `--gpus_per_host` GPUs; `variant` as `parse_row_variant` gives."""
    variant = variant or parse_row_variant("")
    devices = args.hosts * args.gpus_per_host
    overrides = trainer_args(args, batch, devices, strategy) + variant["overrides"]
    profiled = args.profile_steps and strategy in args.profile_strategies
    if profiled:
        overrides += profile_overrides(args)
    config, rest = overrides[0].split("=", 1)[1], overrides[1:]
    with tempfile.TemporaryDirectory() as workdir:
        command = [
            "bash",
            "scripts/launch_local.sh",
            "--hosts",
            str(args.hosts),
            str(args.gpus_per_host),
            config,
            workdir,
            *rest,
        ]
        log = run(command, env, variant.get("source"))
        row = {**logged_row(command, log), "told": told(log)}
        if profiled:
            row.update(profile_figures(workdir, args.profile_steps))
    return row


def logged_row(command: list[str], log: str) -> dict[str, Any]:
    """A row's command and what its trainer logged before any trace: the median rate, the
    intervals' rates and launch times, the last loss."""
    timed = timed_lines(log)
    rate, loss, rates = steady_rate(timed)
    return {
        "command": " ".join(command),
        "images_per_s": rate,
        "logged_images_per_s": rates,
        "logged_launch_ms": logged_launch_ms(timed),
        "loss": loss,
    }


def profile_overrides(args: argparse.Namespace) -> list[str]:
    """The trainer's flags that trace `--profile_steps` steps after the timed ones."""
    return [
        f"--config.profile.first_step={profile_first_step(args)}",
        f"--config.profile.steps={args.profile_steps}",
    ]


def one_gpu_row(args: argparse.Namespace, batch: int, env: dict[str, str]) -> dict:
    """The trainer on one GPU; traced after its timed steps as the default strategy's rows are
    (`--profile_steps`), for how its kernels follow one another beside theirs."""
    profiled = args.profile_steps and DEFAULT in args.profile_strategies
    with tempfile.TemporaryDirectory() as workdir:
        command = [
            sys.executable,
            "-m",
            "jia_jax.main",
            f"--workdir={workdir}",
            *trainer_args(args, batch, 1, DEFAULT),
            "--config.mesh.node=1",
            "--config.mesh.gpu=1",
            *(profile_overrides(args) if profiled else []),
        ]
        one_env = dict(env)
        if env.get("JIA_JAX_PLATFORM") == "cpu":
            # One simulated device (the last count given wins).
            flags = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=1"
            one_env.update(JAX_PLATFORMS="cpu", XLA_FLAGS=flags)
        else:
            one_env.update(CUDA_VISIBLE_DEVICES="0")
        row = logged_row(command, run(command, one_env))
        if profiled:
            row.update(profile_figures(workdir, args.profile_steps))
    return row


def in_process_variants(args: argparse.Namespace) -> list[str]:
    """The `scripts.bench.overlap` variants to time in-process: `--in_process`, with `peer`
    first where `--peer` asks for it."""
    return list(dict.fromkeys((["peer"] if args.peer else []) + args.in_process))


def in_process_command(args: argparse.Namespace, out: str) -> list[str]:
    """`scripts.bench.overlap` timing `in_process_variants` on this run's layout and one GPU."""
    network = args.in_process_network
    return [
        sys.executable,
        "-m",
        "scripts.bench.overlap",
        f"--layouts=1x1,{args.hosts}x{args.gpus_per_host}",
        f"--batches={','.join(map(str, args.batches))}",
        f"--variants={','.join(in_process_variants(args))}",
        *([f"--tell_xla_network={network}"] if network else []),
        f"--out={out}",
        *(["--tiny"] if args.tiny else []),
    ]


def in_process_rows(overlap_doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of several processes of a `scripts.bench.overlap` run as rows of this file (the
    peer: the trainer's forward/backward and update with a plain reduction after backward), each
    timed in-process (queued; also over the mean step and as the loop runs it, where that run
    recorded them), its efficiency against the in-process one-GPU step of that run, and `told`
    where that script told XLA the network."""
    rows = []
    for r in overlap_doc["results"]:
        if "variant" not in r or r.get("layout") == "1x1":
            continue
        keep = ("per_device_batch", "images_per_s", "mean_images_per_s", "loop_images_per_s",
                "efficiency", "exposed_comm_ms", "idle_ms", "told", "error")
        rows.append({
            "hosts": r.get("hosts"),
            "gpus_per_host": r.get("gpus_per_host"),
            "strategy": r["variant"],
            "timing": "in-process",
            **{k: r[k] for k in keep if k in r},
        })
    return rows


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--gpus_per_host", type=int, default=2)
    parser.add_argument(
        "--batches", type=lambda s: [int(x) for x in s.split(",")], default=[256, 64]
    )
    parser.add_argument("--strategies", type=harness.strings, default=[DEFAULT])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--log_every", type=int, default=10)
    parser.add_argument(
        "--rounds", type=int, default=1,
        help="every row this many times in turn, each round's rows tagged `run` (from 1)",
    )
    parser.add_argument("--profile_steps", type=int, default=0)
    parser.add_argument("--profile_strategies", type=harness.strings, default=[DEFAULT])
    parser.add_argument(
        "--xla_flags_variant",
        action="append",
        default=[],
        help="XLA flags appended for one more row of the config's default strategy (repeatable)",
    )
    parser.add_argument(
        "--row_variant",
        action="append",
        default=[],
        help="one more row of the config's default strategy: space-separated --config.* "
        "overrides, NAME=VALUE environment variables (e.g. NCCL_MAX_NCHANNELS=1) and/or "
        "source=DIR, the trainer of another checkout (repeatable)",
    )
    parser.add_argument(
        "--peer",
        action="store_true",
        help="also the plain peer on the same layout, timed in-process (scripts/bench/overlap.py)",
    )
    parser.add_argument(
        "--in_process",
        type=harness.strings,
        default=[],
        help="more scripts/bench/overlap.py variants timed in-process on the same layout",
    )
    parser.add_argument(
        "--in_process_network",
        default="",
        help="a `comm.network` name: the in-process runs tell XLA that network, as the trainer "
        "does across hosts (scripts/bench/overlap.py --tell_xla_network); '' tells it nothing",
    )
    parser.add_argument("--tiny", action="store_true", help="configs/digits.py's tiny ResNet (CPU)")
    parser.add_argument(
        "--override",
        action="append",
        default=[],
        help="a --config.x=y flag for every row, the one-GPU row too, before a row's own "
        "(repeatable; e.g. a smaller model for tests)",
    )
    parser.add_argument("--out", default="bench_hosts.json")
    return parser


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        variants = [parse_row_variant(spec) for spec in args.row_variant]
    except ValueError as e:
        parser.error(str(e))
    env = dict(os.environ)
    devices = args.hosts * args.gpus_per_host
    # The environment comes last (harness.close_record).
    doc: dict[str, Any] = {"args": vars(args), "results": []}
    # Rounds repeat every row in the same order, each against its own one-GPU row: the emulated
    # link drifts within a call, so variants compared round by round see alike links.
    tags = [{"run": r + 1} for r in range(args.rounds)] if args.rounds > 1 else [{}]
    for tag, batch in itertools.product(tags, args.batches):
        base = one_gpu_row(args, batch, env)
        doc["results"].append(
            {
                "hosts": 1,
                "gpus_per_host": 1,
                "strategy": DEFAULT,
                "per_device_batch": batch,
                **base,
                "efficiency": 1.0,
                **tag,
            }
        )
        harness.write_json(args.out, doc)
        plans = (
            [(s, "", None) for s in args.strategies]
            + [(DEFAULT, f, None) for f in args.xla_flags_variant]
            + [(DEFAULT, "", v) for v in variants]
        )
        for strategy, flags, variant in plans:
            row = {
                "hosts": args.hosts,
                "gpus_per_host": args.gpus_per_host,
                "strategy": strategy,
                "per_device_batch": batch,
                "xla_flags": flags,
                **(variant or {}),
                **tag,
            }
            row_env = {**env, **(variant or {}).get("env", {}),
                       "XLA_FLAGS": f"{env.get('XLA_FLAGS', '')} {flags}".strip()}
            try:
                row.update(host_row(args, batch, strategy, row_env, variant))
                row["efficiency"] = row["images_per_s"] / (devices * base["images_per_s"])
            except (RuntimeError, ValueError) as e:
                row["error"] = str(e)[-3000:]
            doc["results"].append(row)
            harness.write_json(args.out, doc)
            print(
                {k: v for k, v in row.items() if k not in ("command", "error")},
                row.get("error", "")[-400:],
                flush=True,
            )
    if in_process_variants(args):
        doc["results"] += run_in_process(args, env)
    harness.close_record(args.out, doc)
    return doc


def run_in_process(args: argparse.Namespace, env: dict[str, str]) -> list[dict[str, Any]]:
    """`in_process_rows` of an `in_process_command` run; on failure one row saying why."""
    child_env = dict(env)
    if env.get("JIA_JAX_PLATFORM") == "cpu":
        child_env["JAX_PLATFORMS"] = "cpu"  # scripts.bench.overlap's CPU switch
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "in_process.json")
        try:
            run(in_process_command(args, out), child_env)
            with open(out) as f:
                return in_process_rows(json.load(f))
        except (RuntimeError, OSError, ValueError) as e:
            return [{"hosts": args.hosts, "gpus_per_host": args.gpus_per_host,
                     "strategy": ",".join(in_process_variants(args)),
                     "per_device_batch": args.batches[0], "error": str(e)[-3000:]}]


if __name__ == "__main__":
    main()
