r"""Bus bandwidth of one all-reduce over each level of an emulated two-host machine, per NCCL setting.

`--hosts` processes of `--gpus_per_host` GPUs each, on one machine, joined by `jax.distributed`;
the mesh is ("node", "gpu") = (hosts, gpus_per_host). For each NCCL setting (`VARIANTS`) the
processes are started afresh and time one fp32 `psum` of each `--size_mib` per device over the
`gpu` axis (inside a process: NVLink), the `node` axis (across processes) and both: one row per
setting and size. Two or more sizes let `scripts/calibrate_comm.py` separate each level's
latency from its bandwidth. Processes of one
setting have different `NCCL_HOSTID`s (two hosts to NCCL: sockets between them) except in
`one_host`, the reference. All settings use NCCL's socket transport on loopback
(`NCCL_SOCKET_IFNAME=lo NCCL_NET=Socket NCCL_IB_DISABLE=1`), as `scripts/launch_local.sh --hosts`.

Bus bandwidth is nccl-tests' `2 (n - 1) / n * bytes / time`; time is the median of `--repeats`
samples of `--calls` back-to-back calls.

  python -m scripts.bench.link --hosts=2 --gpus_per_host=2 --size_mib=1,8,97.5 \
      --out=/tmp/bench_link.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence
from typing import Any

from scripts.bench import emulated_hosts, harness

# name -> (separate hosts?, extra NCCL settings)
VARIANTS = {
    "one_host": (False, {}),
    "hosts_nccl_defaults": (True, {}),
    "hosts_sockets_4x4": (True, {"NCCL_SOCKET_NTHREADS": "4", "NCCL_NSOCKS_PERTHREAD": "4"}),
    "hosts_sockets_8x8": (True, {"NCCL_SOCKET_NTHREADS": "8", "NCCL_NSOCKS_PERTHREAD": "8"}),
}
AXES = {"gpu": ("gpu",), "node": ("node",), "both": ("node", "gpu")}


def child(args: argparse.Namespace) -> None:
    """One process: times the psum over each axis and size; process 0 prints the rows as JSON."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    jax.distributed.initialize(f"127.0.0.1:{args.port}", args.hosts, args.process_id)
    mesh = jax.sharding.Mesh(
        np.array(jax.devices()).reshape(args.hosts, args.gpus_per_host), ("node", "gpu")
    )
    spec = P(("node", "gpu"))
    rows = []
    for size_mib in args.size_mib:
        n = int(size_mib * (1 << 20)) // 4
        x = jax.make_array_from_callback(
            (mesh.devices.size * n,), NamedSharding(mesh, spec), lambda i: np.ones(n, np.float32)
        )
        row: dict[str, Any] = {"size_bytes": n * 4}
        for name, axes in AXES.items():
            f = jax.jit(
                jax.shard_map(
                    lambda v, a=axes: jax.lax.psum(v, a), mesh=mesh, in_specs=spec, out_specs=spec
                )
            )
            jax.block_until_ready(f(x))
            samples = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                for _ in range(args.calls):
                    y = f(x)
                jax.block_until_ready(y)
                samples.append((time.perf_counter() - start) / args.calls)
            size = int(np.prod([mesh.shape[a] for a in axes]))
            t = statistics.median(samples)
            row[name] = {
                "ranks": size,
                "time_s": t,
                "bus_gb_s": 2 * (size - 1) / size * n * 4 / t / 1e9,
            }
            assert float(jnp.ravel(y)[0]) == size  # ones summed over the group
        rows.append(row)
    if args.process_id == 0:
        print("ROWS " + json.dumps(rows), flush=True)


def run_variant(args: argparse.Namespace, name: str) -> list[dict[str, Any]]:
    separate, extra = VARIANTS[name]

    def module_args(process: int, port: int) -> list[str]:
        return [
            "scripts.bench.link",
            "--child",
            f"--port={port}",
            f"--process_id={process}",
            f"--hosts={args.hosts}",
            f"--gpus_per_host={args.gpus_per_host}",
            f"--size_mib={','.join(map(str, args.size_mib))}",
            f"--repeats={args.repeats}",
            f"--calls={args.calls}",
        ]

    statuses, logs = emulated_hosts.run(
        module_args, args.hosts, args.gpus_per_host, extra, args.timeout_s, separate
    )
    found = [line for line in logs[0].splitlines() if line.startswith("ROWS ")]
    if not found or any(statuses):
        return [{"variant": name, "error": logs[0][-2000:] + logs[-1][-1000:]}]
    settings = {**emulated_hosts.LOOPBACK_NETWORK, **extra, "separate_hosts": separate}
    return [{"variant": name, "settings": settings, **r} for r in json.loads(found[0][5:])]


def main(argv: Sequence[str] | None = None) -> dict[str, Any] | None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--gpus_per_host", type=int, default=2)
    parser.add_argument(
        "--size_mib", type=harness.floats, default=[97.5], help="MiB per device, comma-separated"
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument(
        "--variants", type=lambda s: [v for v in s.split(",") if v], default=list(VARIANTS)
    )
    parser.add_argument("--timeout_s", type=float, default=240)
    parser.add_argument("--out", default="bench_link.json")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--process_id", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args)
        return None
    doc: dict[str, Any] = {"args": vars(args), "results": []}
    for name in args.variants:
        for row in run_variant(args, name):
            doc["results"].append(row)
            figures = {a: round(r["bus_gb_s"], 2) for a, r in row.items() if a in AXES}
            print(name, row.get("size_bytes"), figures or row)
        harness.write_json(args.out, doc)
    harness.close_record(args.out, doc)
    return doc


if __name__ == "__main__":
    main()
