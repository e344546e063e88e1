r"""Which part of JAX's recoverable mode crashed runs across emulated hosts: a two-by-two test.

The trainer used to watch its peers through JAX's recoverable mode (`jax_enable_recoverability`)
and a thread asking the coordination service `get_live_nodes` every second; across emulated hosts
(processes of different `NCCL_HOSTID`, NCCL sockets between them) GPU runs then died of heap
corruption. Here 2 processes x `--gpus_per_host` GPUs (emulated hosts, as
`scripts/launch_local.sh --hosts`) run a data-parallel loop (a matmul chain and a `psum` of
`--mib` per device over both mesh axes, at most two steps in flight) for `--seconds`, under each
combination of: recoverable mode on/off, the polling thread on/off. A row records each process's
exit status and whether its log shows a crash (`unaligned`, `Segmentation fault`, `Aborted`).

  python -m scripts.bench.repro_peer_watch --out=/tmp/repro_peer_watch.json
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from scripts.bench import harness

_NETWORK = {
    "NCCL_SOCKET_IFNAME": "lo",
    "NCCL_NET": "Socket",
    "NCCL_IB_DISABLE": "1",
    "NCCL_SOCKET_NTHREADS": "4",
    "NCCL_NSOCKS_PERTHREAD": "4",
}
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
    w = jnp.ones((4096, 4096), jnp.bfloat16)

    def per_device(g, w):
        h = w
        for _ in range(8):
            h = jnp.tanh(h @ w)
        return jax.lax.psum(g, ("node", "gpu")) + h[0, 0]

    step = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=(spec, P()), out_specs=spec))
    done, previous, end = 0, None, time.monotonic() + args.seconds
    while time.monotonic() < end:
        out = step(grads, w)
        if previous is not None:
            jax.block_until_ready(previous)
        previous, done = out, done + 1
    jax.block_until_ready(previous)
    print(f"STEPS {done}", flush=True)


def run_variant(args: argparse.Namespace, recoverable: bool, poll: bool) -> dict[str, Any]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for i in range(2):
        gpus = range(i * args.gpus_per_host, (i + 1) * args.gpus_per_host)
        env = {
            **os.environ,
            **_NETWORK,
            "NCCL_HOSTID": f"jia_jax_host_{i}",
            "CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus)),
        }
        command = (
            [
                sys.executable,
                "-m",
                "scripts.bench.repro_peer_watch",
                "--child",
                f"--port={port}",
                f"--process_id={i}",
                f"--seconds={args.seconds}",
                f"--mib={args.mib}",
            ]
            + (["--recoverable"] if recoverable else [])
            + (["--poll"] if poll else [])
        )
        procs.append(
            subprocess.Popen(
                command,
                cwd=harness.REPO,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=args.seconds + 120)[0])
        except subprocess.TimeoutExpired:
            p.kill()
            logs.append(p.communicate()[0] + "\n[killed: timeout]")
    steps = [re.findall(r"STEPS (\d+)", log) for log in logs]
    return {
        "recoverable": recoverable,
        "poll_get_live_nodes": poll,
        "returncodes": [p.returncode for p in procs],
        "steps": [int(s[0]) if s else None for s in steps],
        "crashed": any(bool(_CRASH.search(log)) for log in logs),
        "log_tails": [log[-1500:] for log in logs],
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any] | None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus_per_host", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--mib", type=float, default=48)
    parser.add_argument("--repeats", type=int, default=1)
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
    doc["environment"] = harness.environment()  # last: JAX here would hold the GPUs
    harness.write_json(args.out, doc)
    return doc


if __name__ == "__main__":
    main()
