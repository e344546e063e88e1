"""What the trainer tells XLA's latency estimator about the hosts and the network."""

import json
import os
import subprocess
import sys

import ml_collections
import pytest

from jia_jax import comm_model
from jia_jax import xla_network

CALIBRATION = os.path.join(os.path.dirname(comm_model.__file__), "comm_calibration.json")


def _comm(tell: bool, network: str = "emulated") -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict({"tell_xla_network": tell, "network": network})


def _dist(coordinator: str = "", processes: int | None = None) -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict(
        {"coordinator_address": coordinator, "num_processes": processes},
        type_safe=False,
    )


ABSENT = ml_collections.ConfigDict({"network": "emulated"})  # a config from before the option
LAUNCHED = _dist("127.0.0.1:1234", 2)  # what scripts/launch_local.sh passes each process


def test_flag_gives_gpus_bandwidth_in_gigabytes_and_latency_in_microseconds():
    link = comm_model.Link(alpha_s=171.3e-6, beta_bytes_per_s=6.4323e9)
    # partition_size too: XLA takes the devices of one partition for NVLink peers from it (or
    # the module's own), not from gpus_per_node; told gpus_per_node alone, the schedule stayed.
    assert xla_network.estimator_flag(1, link) == (
        "--xla_gpu_analytical_latency_estimator_options="
        "gpus_per_node=1,partition_size=1,nic_speed_gbps=6.432,rtt_us=171"
    )
    # A latency under half a microsecond is still told as 1 (XLA ignores values below 1).
    assert xla_network.estimator_flag(2, comm_model.Link(1e-7, 5e10)).endswith(
        "gpus_per_node=2,partition_size=2,nic_speed_gbps=50.000,rtt_us=1"
    )


def test_with_estimator_appends_to_the_flags_unless_they_tell_it_already():
    link = comm_model.Link(alpha_s=171.3e-6, beta_bytes_per_s=6.4323e9)
    assert xla_network.with_estimator("", 1, link) == xla_network.estimator_flag(1, link)
    assert xla_network.with_estimator("--xla_dump_to=/d", 2, link) == (
        "--xla_dump_to=/d " + xla_network.estimator_flag(2, link)
    )
    own = "--xla_gpu_analytical_latency_estimator_options=gpus_per_node=4"
    assert xla_network.with_estimator(own, 1, link) == own


@pytest.mark.parametrize("gpus, beta", [(0, 6e9), (1, 0.0)])
def test_flag_refuses_no_gpus_or_no_bandwidth(gpus, beta):
    with pytest.raises(ValueError, match="at least one GPU per host and a positive bandwidth"):
        xla_network.estimator_flag(gpus, comm_model.Link(1e-4, beta))


@pytest.mark.parametrize(
    "listed, gpus",
    [
        ("0,1", ["0", "1"]),
        ("3", ["3"]),
        ("", []),
        ("0,x,2", ["0"]),
        ("GPU-8f1c2a3b-0000-1111, 1", ["GPU-8f1c2a3b-0000-1111", "1"]),
        ("-1", []),
    ],
)
def test_visible_gpus_are_cuda_visible_devices_up_to_the_first_invalid_entry(listed, gpus):
    assert xla_network.visible_gpus({"CUDA_VISIBLE_DEVICES": listed}) == gpus


def test_visible_gpus_without_cuda_visible_devices_are_the_device_files_ordinals(monkeypatch):
    monkeypatch.setattr(
        xla_network.glob, "glob", lambda pattern: ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2"]
    )
    assert xla_network.visible_gpus({}) == ["0", "1", "2"]


def test_environment_appends_the_named_networks_links_to_the_users_flags():
    emulated = json.load(open(CALIBRATION))
    fit = emulated["emulated_hosts"][emulated["default_emulated"]]["inter"]
    env = {"XLA_FLAGS": "--xla_dump_to=/tmp/d", "CUDA_VISIBLE_DEVICES": "0,1"}
    added = xla_network.environment(_comm(True), LAUNCHED, env)
    assert added == {
        "XLA_FLAGS": "--xla_dump_to=/tmp/d --xla_gpu_analytical_latency_estimator_options="
        f"gpus_per_node=2,partition_size=2,nic_speed_gbps={fit['beta_bytes_per_s'] / 1e9:.3f},"
        f"rtt_us={round(fit['alpha_s'] * 1e6)}"
    }
    # The default fabric (""): the calibration's published network.
    fabric = emulated["fabrics"][emulated["default_fabric"]]
    env = {"CUDA_VISIBLE_DEVICES": "0", "SLURM_NTASKS": "16"}  # a SLURM job, found by JAX
    told = xla_network.environment(_comm(True, ""), _dist(), env)["XLA_FLAGS"]
    assert f"nic_speed_gbps={fabric['beta_bytes_per_s'] / 1e9:.3f}," in told


def test_told_bandwidth_scale_scales_the_told_bandwidth_only():
    fit = comm_model.network_model("emulated").inter
    comm = ml_collections.ConfigDict(
        {"tell_xla_network": True, "network": "emulated", "told_bandwidth_scale": 0.5})
    told = xla_network.environment(comm, LAUNCHED, {"CUDA_VISIBLE_DEVICES": "0"})["XLA_FLAGS"]
    assert told == xla_network.estimator_flag(
        1, comm_model.Link(fit.alpha_s, fit.beta_bytes_per_s / 2))
    assert f"nic_speed_gbps={fit.beta_bytes_per_s / 2e9:.3f}," in told  # half, same latency
    # Configs from before the field: told as fitted.
    before = xla_network.environment(_comm(True), LAUNCHED, {"CUDA_VISIBLE_DEVICES": "0"})
    assert before["XLA_FLAGS"] == xla_network.estimator_flag(1, fit)


@pytest.mark.parametrize("scale", [0, -1.0, "half", True])
def test_a_told_bandwidth_scale_that_is_no_positive_number_names_the_field(scale):
    comm = ml_collections.ConfigDict(
        {"tell_xla_network": True, "network": "emulated", "told_bandwidth_scale": scale})
    with pytest.raises(ValueError, match="comm.told_bandwidth_scale"):
        xla_network.environment(comm, LAUNCHED, {"CUDA_VISIBLE_DEVICES": "0"})


@pytest.mark.parametrize(
    "comm, dist, env",
    [
        (_comm(False), LAUNCHED, {"CUDA_VISIBLE_DEVICES": "0"}),
        (ABSENT, LAUNCHED, {"CUDA_VISIBLE_DEVICES": "0"}),
        (_comm(True), LAUNCHED, {"CUDA_VISIBLE_DEVICES": ""}),
        (
            _comm(True),
            LAUNCHED,
            {
                "CUDA_VISIBLE_DEVICES": "0",
                "XLA_FLAGS": "--xla_gpu_analytical_latency_estimator_options=gpus_per_node=4",
            },
        ),
        (_comm(True), _dist(), {"CUDA_VISIBLE_DEVICES": "0,1"}),
        (_comm(True), _dist(), {"CUDA_VISIBLE_DEVICES": "0", "SLURM_NTASKS": "1"}),
        (_comm(True), _dist("127.0.0.1:1234", 1), {"CUDA_VISIBLE_DEVICES": "0"}),
        # scripts/launch_local.sh without --hosts: every process on this host.
        (_comm(True), LAUNCHED, {"CUDA_VISIBLE_DEVICES": "0", "JIA_JAX_LOCAL_PROCESSES": "2"}),
        (_comm(True), _dist(), {"CUDA_VISIBLE_DEVICES": "0", "SLURM_NTASKS": "4",
                                "SLURM_NTASKS_PER_NODE": "4"}),
    ],
    ids=["off", "absent", "no_gpu", "users_own", "one_process", "one_task", "one_launched",
         "local_launch", "one_node"],
)
def test_environment_adds_nothing_when_off_on_one_host_without_gpus_or_set_by_the_user(
    comm, dist, env
):
    # One host has no network to tell of: XLA keeps its own schedule there.
    assert xla_network.environment(comm, dist, env) == {}


@pytest.mark.parametrize(
    "dist, env, gpus_per_host",
    [
        (LAUNCHED, {}, 1),
        (LAUNCHED, {"JIA_JAX_LOCAL_PROCESSES": "1"}, 1),  # launch_local.sh --hosts
        (_dist(), {"SLURM_NTASKS": "2"}, 1),
        (_dist(), {"SLURM_NTASKS": "16", "SLURM_NTASKS_PER_NODE": "8"}, 8),
        (_dist(), {"SLURM_NTASKS": "8", "SLURM_NTASKS_PER_NODE": "4(x2)"}, 4),
        (_dist(), {"OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, 2),
        (_dist(), {"PMI_SIZE": "4"}, 1),
    ],
)
def test_environment_tells_xla_every_host_of_several_and_its_gpus(dist, env, gpus_per_host):
    # One GPU a process: the host's GPUs are its processes'.
    added = xla_network.environment(_comm(True), dist, {**env, "CUDA_VISIBLE_DEVICES": "0"})
    told = f"gpus_per_node={gpus_per_host},partition_size={gpus_per_host},"
    assert told in added["XLA_FLAGS"]


def test_environment_names_the_field_of_an_unknown_network():
    with pytest.raises(ValueError, match=r"comm\.network='infiniband' is not one of"):
        xla_network.environment(_comm(True, "infiniband"), LAUNCHED, {"CUDA_VISIBLE_DEVICES": "0"})
    with pytest.raises(ValueError, match=r"comm\.network='infiniband' is not one of"):
        # In one process too: the typo is found before a run that would span hosts.
        xla_network.environment(_comm(True, "infiniband"), _dist(), {"CUDA_VISIBLE_DEVICES": "0"})


def test_this_xla_accepts_the_flag():
    # XLA aborts a process whose XLA_FLAGS hold a flag it does not know.
    flag = xla_network.estimator_flag(1, comm_model.Link(1.7e-4, 6.4e9))
    code = "import jax, jax.numpy as jnp; print(int(jax.jit(lambda x: x + 1)(jnp.ones(2))[0]))"
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=dict(os.environ, XLA_FLAGS=flag, JAX_PLATFORMS="cpu"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "2"


@pytest.mark.parametrize(
    "processes, environ, one",
    [
        (1, {}, True),
        (2, {"JIA_JAX_LOCAL_PROCESSES": "2"}, True),  # launch_local.sh without --hosts
        (2, {"JIA_JAX_LOCAL_PROCESSES": "1"}, False),  # with --hosts: each process a host
        (2, {}, False),  # no launcher's count: a process per host
        (8, {"SLURM_NTASKS_PER_NODE": "4(x2)"}, False),  # 2 nodes of 4 tasks
        (4, {"OMPI_COMM_WORLD_LOCAL_SIZE": "4"}, True),
    ],
)
def test_one_host_is_where_the_launcher_counts_every_process_here(processes, environ, one):
    assert xla_network.one_host(processes, environ) is one
