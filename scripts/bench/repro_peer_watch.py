r"""Which part of JAX's recoverable mode crashed runs across emulated hosts: a two-by-two test.

The trainer used to watch its peers through JAX's recoverable mode (`jax_enable_recoverability`)
and a thread asking the coordination service `get_live_nodes` every second; across emulated hosts
(processes of different `NCCL_HOSTID`, NCCL sockets between them) GPU runs then died of heap
corruption. Here 2 processes x `--gpus_per_host` GPUs (emulated hosts, as
`scripts/launch_local.sh --hosts`) run a data-parallel loop (a matmul chain and a `psum` of
`--mib` per device over both mesh axes, at most two steps in flight) for `--steps` steps, under each
combination of: recoverable mode on/off, the polling thread on/off. A row records each process's
exit status and whether its log shows a crash (`unaligned`, `Segmentation fault`, `Aborted`).

  python -m scripts.bench.repro_peer_watch --out=/tmp/repro_peer_watch.json
"""

from __future__ import annotations

import argparse
import itertools
import re
import threading
import time
from collections.abc import Sequence
from typing import Any

from scripts.bench import emulated_hosts, harness

# The launcher's socket setting (scripts/launch_local.sh --hosts).
_SOCKETS = {"NCCL_SOCKET_NTHREADS": "4", "NCCL_NSOCKS_PERTHREAD": "4"}
_CRASH = re.compile(r"unaligned|Segmentation fault|Aborted|double free|corrupted")


def child(args: argparse.Namespace) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    if args.recoverable:
        jax.config.update("jax_enable_recoverability", True)
    jax.distributed.initialize(
        f"127.0.0.1:{args.port}", 2, args.process_id, heartbeat_timeout_seconds=30
    )
    if args.poll:
        from jax._src import distributed

        client = distributed.global_state.client

        def poll():
            while True:
                client.get_live_nodes([0, 1])
                time.sleep(1.0)

        threading.Thread(target=poll, daemon=True).start()
    mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(2, -1), ("node", "gpu"))
    spec = P(("node", "gpu"))
    n = int(args.mib * (1 << 20)) // 2
    grads = jax.make_array_from_callback(
        (mesh.devices.size * n,), NamedSharding(mesh, spec), lambda i: np.ones(n, jnp.bfloat16)
    )
    w = jnp.ones((args.width, args.width), jnp.bfloat16)

    def per_device(g, w):
        h = w
        for _ in range(8):
            h = jnp.tanh(h @ w)
        return jax.lax.psum(g, ("node", "gpu")) + h[0, 0]

    step = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=(spec, P()), out_specs=spec))
    # Both processes run the same number of steps: a collective one of them never joins would
    # hang the other (an earlier version ran each for the same time, and one could hang).
    previous = None
    for _ in range(args.steps):
        out = step(grads, w)
        if previous is not None:
            jax.block_until_ready(previous)
        previous = out
    jax.block_until_ready(previous)
    print(f"STEPS {args.steps}", flush=True)


def run_variant(args: argparse.Namespace, recoverable: bool, poll: bool) -> dict[str, Any]:
    def module_args(process: int, port: int) -> list[str]:
        flags = [
            "scripts.bench.repro_peer_watch",
            "--child",
            f"--port={port}",
            f"--process_id={process}",
            f"--steps={args.steps}",
            f"--mib={args.mib}",
            f"--width={args.width}",
        ]
        return flags + (["--recoverable"] if recoverable else []) + (["--poll"] if poll else [])

    statuses, logs = emulated_hosts.run(
        module_args, 2, args.gpus_per_host, _SOCKETS, args.timeout_s
    )
    steps = [re.findall(r"STEPS (\d+)", log) for log in logs]
    return {
        "recoverable": recoverable,
        "poll_get_live_nodes": poll,
        "returncodes": statuses,
        "steps": [int(s[0]) if s else None for s in steps],
        "crashed": any(bool(_CRASH.search(log)) for log in logs),
        "log_tails": [log[-1500:] for log in logs],
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any] | None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus_per_host", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4000, help="about 25 s on H100s")
    parser.add_argument("--timeout_s", type=float, default=300)
    parser.add_argument("--mib", type=float, default=48)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--width", type=int, default=4096, help="matrices of the compute chain")
    parser.add_argument(
        "--combos",
        type=lambda text: [tuple(c == "1" for c in pair) for pair in text.split(",")],
        default=[(True, True), (True, False), (False, True), (False, False)],
        help="recoverable/poll pairs as 0/1 digits, e.g. 11,10,01",
    )
    parser.add_argument("--out", default="repro_peer_watch.json")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--recoverable", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--poll", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--process_id", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args)
        return None
    doc: dict[str, Any] = {"args": vars(args), "results": []}
    for _, (recoverable, poll) in itertools.product(range(args.repeats), args.combos):
        row = run_variant(args, recoverable, poll)
        doc["results"].append(row)
        harness.write_json(args.out, doc)
        print({k: v for k, v in row.items() if k != "log_tails"}, flush=True)
    harness.close_record(args.out, doc)
    return doc


if __name__ == "__main__":
    main()
