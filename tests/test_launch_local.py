"""scripts/launch_local.sh: what each process it starts is given (environment and flags).

A stand-in `python3` first on PATH records each trainer start instead of training (and runs the
real interpreter for the launcher's own one-liner), so the launcher itself runs unchanged.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
_STAND_IN = """#!/usr/bin/env bash
if [ "$1" = -m ]; then
  exec "{python}" -c 'import json, os, sys; json.dump({{"argv": sys.argv[1:], "env": dict(os.environ)}}, open(os.path.join(os.environ["RECORD_DIR"], str(os.getpid())), "w"))' "$@"
fi
exec "{python}" "$@"
"""
NCCL_NETWORK = {
    "NCCL_SOCKET_IFNAME": "lo",
    "NCCL_NET": "Socket",
    "NCCL_IB_DISABLE": "1",
    "NCCL_SOCKET_NTHREADS": "4",
    "NCCL_NSOCKS_PERTHREAD": "4",
}


def launch(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> list[dict]:
    """Runs the launcher with `args`; returns each process's record, in process order."""
    bin_dir, records = tmp_path / "bin", tmp_path / "records"
    bin_dir.mkdir()
    records.mkdir()
    stand_in = bin_dir / "python3"
    stand_in.write_text(_STAND_IN.format(python=sys.executable))
    stand_in.chmod(0o755)
    base = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
    full_env = {**base, "PATH": f"{bin_dir}:{base['PATH']}", "RECORD_DIR": str(records)}
    full_env.update(env or {})
    subprocess.run(
        ["bash", "scripts/launch_local.sh", *args], cwd=REPO_ROOT, env=full_env, check=True
    )
    started = [json.loads(p.read_text()) for p in records.iterdir()]

    def process_id(record):
        flag = next(a for a in record["argv"] if a.startswith("--config.distributed.process_id="))
        return int(flag.split("=")[1])

    return sorted(started, key=process_id)


def flag(record: dict, name: str) -> str:
    return next(a.split("=", 1)[1] for a in record["argv"] if a.startswith(f"--{name}="))


def test_hosts_gives_each_process_its_own_gpus_host_id_and_the_socket_network(tmp_path):
    started = launch(
        tmp_path,
        "--hosts",
        "2",
        "2",
        "configs/digits.py",
        "/tmp/w",
        "--config.total_steps=3",
        env={"JIA_JAX_PLATFORM": "gpu"},
    )
    assert len(started) == 2
    assert [r["env"]["CUDA_VISIBLE_DEVICES"] for r in started] == ["0,1", "2,3"]
    host_ids = [r["env"]["NCCL_HOSTID"] for r in started]
    assert len(set(host_ids)) == 2, host_ids
    for i, record in enumerate(started):
        assert {k: record["env"].get(k) for k in NCCL_NETWORK} == NCCL_NETWORK
        assert flag(record, "config.distributed.process_id") == str(i)
        assert flag(record, "config.distributed.num_processes") == "2"
        assert (flag(record, "config.mesh.node"), flag(record, "config.mesh.gpu")) == ("2", "2")
        assert record["argv"][-1] == "--config.total_steps=3"
    # One coordinator for both.
    assert len({flag(r, "config.distributed.coordinator_address") for r in started}) == 1


def test_hosts_keeps_the_callers_nccl_settings(tmp_path):
    # A user's measured settings (or NVLink multicast kept off by the machine) are not overridden.
    mine = {"NCCL_SOCKET_NTHREADS": "8", "NCCL_SOCKET_IFNAME": "eth0", "NCCL_NVLS_ENABLE": "0"}
    started = launch(
        tmp_path,
        "--hosts",
        "2",
        "1",
        "configs/digits.py",
        "/tmp/w",
        env={"JIA_JAX_PLATFORM": "gpu", **mine},
    )
    for record in started:
        assert {k: record["env"][k] for k in mine} == mine
        assert record["env"]["NCCL_NSOCKS_PERTHREAD"] == "4"


def test_without_hosts_processes_share_one_host(tmp_path):
    started = launch(
        tmp_path, "2", "2", "configs/digits.py", "/tmp/w", env={"JIA_JAX_PLATFORM": "gpu"}
    )
    assert [r["env"]["CUDA_VISIBLE_DEVICES"] for r in started] == ["0,1", "2,3"]
    for record in started:
        assert not any(k.startswith("NCCL_") for k in record["env"]), record["env"]


def test_cpu_processes_simulate_their_devices_over_gloo(tmp_path):
    started = launch(
        tmp_path, "2", "4", "configs/digits.py", "/tmp/w", env={"JIA_JAX_PLATFORM": "cpu"}
    )
    for record in started:
        assert record["env"]["JAX_PLATFORMS"] == "cpu"
        assert record["env"]["JAX_CPU_COLLECTIVES_IMPLEMENTATION"] == "gloo"
        assert record["env"]["XLA_FLAGS"].split()[-1] == "--xla_force_host_platform_device_count=4"
