"""Tests for jia_jax.checkpoint and the restore behind it (checkpoint_restore, checkpoint_layout):
round trips on a 2x4 mesh, keep-N, fallback, mismatch, failed writes."""

import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jia_jax import checkpoint
from jia_jax import checkpoint_layout
from jia_jax import checkpoint_restore
from tests import mp_util


@pytest.fixture(scope="module")
def mesh():
    return Mesh(np.array(jax.devices()).reshape(2, 4), ("node", "gpu"))


def host_state(seed):
    """A training-state-like pytree of numpy arrays: the reference values."""
    rng = np.random.default_rng(seed)
    return {
        "params": {
            "w": rng.standard_normal((8, 4)).astype(np.float32),
            "b": rng.standard_normal(3).astype(jax.numpy.bfloat16),
        },
        "opt_state": (rng.standard_normal((8, 4)).astype(np.float32),),
        "rng": rng.integers(0, 2**32, size=2, dtype=np.uint32),
        "step": np.int32(seed),
    }


def shardings(mesh, w_spec):
    """Shardings for host_state's leaves; `w_spec` places the two (8, 4) arrays."""
    return {
        "params": {"w": NamedSharding(mesh, w_spec), "b": NamedSharding(mesh, P())},
        "opt_state": (NamedSharding(mesh, w_spec),),
        "rng": NamedSharding(mesh, P()),
        "step": NamedSharding(mesh, P()),
    }


def device_state(host, shards):
    return jax.tree.map(jax.device_put, host, shards)


def abstract_state(host, shards):
    return jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype, sharding=s),
        host,
        shards,
    )


def assert_bitwise_equal(restored, reference):
    restored_leaves = jax.tree.leaves(restored)
    reference_leaves = jax.tree.leaves(reference)
    assert jax.tree.structure(restored) == jax.tree.structure(reference)
    for got, want in zip(restored_leaves, reference_leaves):
        got, want = np.asarray(got), np.asarray(want)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.tobytes() == want.tobytes()


def test_async_round_trip_is_bitwise_and_uses_target_shardings(mesh, tmp_path):
    host = host_state(seed=7)
    meta = {"config": {"model": {"name": "resnet18"}}, "data_position": 123, "seed": 7}
    with checkpoint.Checkpointer(tmp_path, max_to_keep=2, save_every_steps=1) as ckpt:
        assert ckpt.save(7, device_state(host, shardings(mesh, P(("node", "gpu")))), meta)
        ckpt.wait()

    # A new run (new Checkpointer) restores onto different target shardings.
    targets = shardings(mesh, P("node", "gpu"))
    with checkpoint.Checkpointer(tmp_path, max_to_keep=2, save_every_steps=1) as ckpt:
        step, state, restored_meta = ckpt.restore_latest(abstract_state(host, targets))
    assert step == 7
    assert restored_meta == meta
    assert_bitwise_equal(state, host)
    assert jax.tree.leaves(jax.tree.map(lambda x: x.sharding, state)) == jax.tree.leaves(targets)


def test_saving_a_replicated_state_compiles_no_program(mesh, tmp_path):
    """Regression: orbax sliced each replicated array into a piece per device to write in
    parallel, lowering and compiling a program per piece shape and device at a first save (on
    these 8 devices, 8 per leaf shape; 160 and 10 s for 20 leaves). Written whole, none. Shapes
    of this test alone, so nothing an earlier test compiled in this process hides a lowering."""
    rng = np.random.default_rng(0)
    host = {f"leaf{i}": rng.standard_normal((24, 5 + i)).astype(np.float32) for i in range(3)}
    state = jax.tree.map(lambda x: jax.device_put(x, NamedSharding(mesh, P())), host)
    jax.block_until_ready(state)
    lowered = []

    def listen(event: str, _: float, **__) -> None:
        if event.endswith("jaxpr_to_mlir_module_duration"):
            lowered.append(event)

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        with checkpoint.Checkpointer(tmp_path, max_to_keep=1, save_every_steps=1) as ckpt:
            assert ckpt.save(1, state, {"seed": 0})
            ckpt.wait()
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    assert lowered == []
    targets = {k: NamedSharding(mesh, P()) for k in host}
    with checkpoint.Checkpointer(tmp_path, max_to_keep=1, save_every_steps=1) as ckpt:
        _, restored, _ = ckpt.restore_latest(abstract_state(host, targets))
    assert_bitwise_equal(restored, host)


def test_empty_directory_restores_nothing(mesh, tmp_path):
    host = host_state(seed=0)
    with checkpoint.Checkpointer(tmp_path, max_to_keep=2, save_every_steps=1) as ckpt:
        assert ckpt.restore_latest(abstract_state(host, shardings(mesh, P()))) is None


def test_saves_on_interval_keeps_newest_and_force(mesh, tmp_path):
    state = device_state(host_state(seed=1), shardings(mesh, P()))
    with checkpoint.Checkpointer(tmp_path, max_to_keep=2, save_every_steps=2) as ckpt:
        saved = [ckpt.save(step, state, {"step": step}) for step in range(7)]
        assert saved == [True, False, True, False, True, False, True]
        assert ckpt.save(7, state, {}, force=True)
        # Forcing a step that is saved already is a no-op, not an error.
        assert not ckpt.save(7, state, {}, force=True)
        ckpt.wait()
        assert ckpt.all_steps() == [6, 7]


# Orbax (OCDBT) keeps array chunks in files under "d/" folders; "all" also hits the metadata.
@pytest.mark.parametrize("damaged", ["array data", "all"])
# When one read fails, orbax closes its asyncio loop while tensorstore still completes the other
# reads, which then report "Event loop is closed" from a background thread (harmless).
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_corrupt_latest_falls_back_to_previous(mesh, tmp_path, caplog, damaged):
    shards = shardings(mesh, P(("node", "gpu")))
    with checkpoint.Checkpointer(tmp_path, max_to_keep=3, save_every_steps=1) as ckpt:
        ckpt.save(1, device_state(host_state(seed=1), shards), {"step": 1})
        ckpt.save(2, device_state(host_state(seed=2), shards), {"step": 2})
        ckpt.wait()
    damaged_files = [
        path
        for path in (tmp_path / "2" / "state").rglob("*")
        if path.is_file() and (damaged == "all" or path.parent.name == "d")
    ]
    assert damaged_files
    for path in damaged_files:
        os.truncate(path, path.stat().st_size // 2)

    with checkpoint.Checkpointer(tmp_path, max_to_keep=3, save_every_steps=1) as ckpt:
        with caplog.at_level("WARNING"):
            step, state, meta = ckpt.restore_latest(abstract_state(host_state(seed=1), shards))
        assert (step, meta) == (1, {"step": 1})
        assert_bitwise_equal(state, host_state(seed=1))
        warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        # One short line: the step moved, where, where the error is, and the step resumed from;
        # orbax's own lines about the damage are not shown.
        [warning] = warnings
        assert "\n" not in warning and len(warning) < 200 + len(str(tmp_path)), warning
        assert re.match(
            rf"Moved the unreadable checkpoint of step 2 to {tmp_path}/corrupt/2 \(why: "
            r"unreadable_process_\*\.txt in it\); resuming from the checkpoint of step 1\.$",
            warning,
        ), warning
        # Kept for inspection, out of the way of the resumed run's save at step 2, with the
        # whole error beside it.
        assert (tmp_path / "corrupt" / "2" / "state").is_dir()
        why = (tmp_path / "corrupt" / "2" / "unreadable_process_0.txt").read_text()
        assert re.match(r"^\w+(Error|Exception): \S", why), why
        assert ckpt.all_steps() == [1]
        assert ckpt.save(2, state, {"step": 2})


def test_real_optimizer_state_with_an_empty_entry_round_trips(mesh, tmp_path):
    """optax states hold leafless nodes (MaskedState(EmptyState())) first: regression test for
    a shape check that failed on them and quarantined every good checkpoint."""
    import optax

    params = {"w": np.arange(12.0, dtype=np.float32).reshape(3, 4), "b": np.ones(4, np.float32)}
    tx = optax.chain(
        optax.masked(optax.add_decayed_weights(1e-4), {"w": True, "b": False}),
        optax.sgd(0.1, momentum=0.9),
    )
    host = {"params": params, "opt_state": tx.init(params), "step": np.int32(3)}
    replicated = NamedSharding(mesh, P())
    state = jax.tree.map(lambda x: jax.device_put(x, replicated), host)
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype, sharding=replicated), host
    )
    with checkpoint.Checkpointer(tmp_path, max_to_keep=2, save_every_steps=1) as ckpt:
        ckpt.save(3, state, {"step": 3})
        ckpt.wait()
        step, restored, _ = ckpt.restore_latest(abstract)
    assert step == 3
    assert not (tmp_path / "corrupt").exists()
    assert_bitwise_equal(restored, host)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_no_readable_checkpoint_fails_loudly_instead_of_starting_over(mesh, tmp_path, caplog):
    shards = shardings(mesh, P())
    with checkpoint.Checkpointer(tmp_path, max_to_keep=2, save_every_steps=1) as ckpt:
        ckpt.save(1, device_state(host_state(seed=1), shards), {"step": 1})
        ckpt.wait()
    for path in (tmp_path / "1" / "state").rglob("*"):
        if path.is_file():
            os.truncate(path, path.stat().st_size // 2)
    with checkpoint.Checkpointer(tmp_path, max_to_keep=2, save_every_steps=1) as ckpt:
        with (
            caplog.at_level("WARNING"),
            pytest.raises(checkpoint_restore.NoReadableCheckpointError, match="--workdir") as info,
        ):
            ckpt.restore_latest(abstract_state(host_state(seed=1), shards))
    # The error is the one line: orbax's own warnings about the damaged metadata are not shown.
    assert not caplog.records, [r.getMessage() for r in caplog.records]
    message = str(info.value)
    assert "\n" not in message and len(message) < 300 + len(str(tmp_path)), message
    assert f"Moved the unreadable checkpoint of step 1 to {tmp_path}/corrupt/1 " in message
    assert (tmp_path / "corrupt" / "1" / "state").is_dir()
    assert (tmp_path / "corrupt" / "1" / "unreadable_process_0.txt").is_file()


def test_mismatched_state_raises_and_keeps_checkpoint(mesh, tmp_path):
    host = host_state(seed=3)
    shards = shardings(mesh, P())
    with checkpoint.Checkpointer(tmp_path, max_to_keep=2, save_every_steps=1) as ckpt:
        ckpt.save(3, device_state(host, shards), {})
        ckpt.wait()
        other = abstract_state(host, shards)
        other["params"]["w"] = jax.ShapeDtypeStruct((8, 2), np.float32, sharding=shards["step"])
        other["params"]["extra"] = jax.ShapeDtypeStruct((5,), np.float32, sharding=shards["step"])
        del other["rng"]
        with pytest.raises(checkpoint_layout.CheckpointMismatchError) as info:
            ckpt.restore_latest(other)
        message = str(info.value)
        assert "params.w: checkpoint float32[8, 4], state float32[8, 2]" in message
        assert "params.extra: in the state float32[5], not in the checkpoint" in message
        assert "rng: in the checkpoint uint32[2], not in the state" in message
        assert "--workdir" in message
        assert ckpt.all_steps() == [3]


def test_abstract_state_without_shardings_is_rejected(tmp_path):
    unsharded = {"w": jax.ShapeDtypeStruct((2,), np.float32)}
    with checkpoint.Checkpointer(tmp_path, max_to_keep=2, save_every_steps=1) as ckpt:
        with pytest.raises(ValueError, match=r"Restoring a checkpoint needs .*\['w'\]"):
            ckpt.restore_latest(unsharded)
    # The read-only read (evaluation, export) says the same, not the trainer's method's name.
    with pytest.raises(ValueError, match=r"Restoring a checkpoint needs .*\['w'\]"):
        checkpoint_restore.read_checkpoint(tmp_path, unsharded)


# Run by two processes of 4 CPU devices each: a 2x4 mesh whose "node" axis spans the processes.
MULTIPROCESS_SCRIPT = """
import os
import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from jia_jax import checkpoint
from jia_jax import checkpoint_restore

process_id, directory = jax.process_index(), os.environ["CKPT_DIR"]
mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("node", "gpu"))
def state(step):
    ref = np.arange(32, dtype=np.float32).reshape(8, 4) * step
    sharding = NamedSharding(mesh, P(("node", "gpu")))
    return ref, {"w": jax.make_array_from_callback(ref.shape, sharding, lambda i: ref[i])}
target = NamedSharding(mesh, P("gpu", "node"))
abstract = {"w": jax.ShapeDtypeStruct((8, 4), np.float32, sharding=target)}

ckpt = checkpoint.Checkpointer(directory, max_to_keep=3, save_every_steps=1)
ckpt.save(1, state(1)[1], {"step": 1})
ckpt.save(2, state(2)[1], {"step": 2})
ckpt.wait()
if process_id == 0:
    for root, _, files in os.walk(os.path.join(directory, "2", "state")):
        for name in files:
            path = os.path.join(root, name)
            os.truncate(path, os.path.getsize(path) // 2)
ocp.multihost.sync_global_processes("truncated")

step, restored, meta = ckpt.restore_latest(abstract)
assert (step, meta) == (1, {"step": 1}), (step, meta)
assert restored["w"].sharding == target
for shard in restored["w"].addressable_shards:
    np.testing.assert_array_equal(np.asarray(shard.data), state(1)[0][shard.index])
assert os.path.isdir(os.path.join(directory, "corrupt", "2"))
assert checkpoint_restore.any_process(process_id == 1)
assert not checkpoint_restore.any_process(False)
ckpt.close()
print("OK", process_id)
"""


def test_multiprocess_fallback_restore_and_stop_agreement(tmp_path):
    outputs = mp_util.run_multiprocess(
        MULTIPROCESS_SCRIPT, num_processes=2, local_devices=4, env={"CKPT_DIR": str(tmp_path)}
    )
    for i, out in enumerate(outputs):
        assert f"OK {i}" in out, out[-3000:]


# Two processes whose views of one checkpoint differ (a shared disk that one of them reads stale):
# process 1's layout check says what CKPT_VIEW asks. Before the processes agreed on the check,
# the process that found something skipped the read while the other read on, and waited for it.
DIVERGENT_VIEW_SCRIPT = """
import os
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from jia_jax import checkpoint, checkpoint_layout

process_id, directory, view = jax.process_index(), os.environ["CKPT_DIR"], os.environ["CKPT_VIEW"]
mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("node", "gpu"))
sharding = NamedSharding(mesh, P(("node", "gpu")))
def state(step):
    return {"w": jax.device_put(np.full((8, 4), step, np.float32), sharding)}
abstract = {"w": jax.ShapeDtypeStruct((8, 4), np.float32, sharding=sharding)}
ckpt = checkpoint.Checkpointer(directory, max_to_keep=3, save_every_steps=1)
ckpt.save(1, state(1), {"step": 1})
ckpt.save(2, state(2), {"step": 2})
ckpt.wait()
if process_id == 1:
    def differs(manager, step, abstract_state):
        if step == 2:
            if view == "mismatch":
                raise checkpoint_layout.CheckpointMismatchError("another state here")
            raise OSError("metadata missing here")
        return frozenset()
    checkpoint_layout.check_layout = differs
try:
    step, restored, meta = ckpt.restore_latest(abstract)
    print("RESUMED", process_id, step, float(restored["w"].addressable_shards[0].data[0, 0]))
except checkpoint_layout.CheckpointMismatchError as error:
    print("MISMATCH", process_id, str(error).splitlines()[0])
ckpt.close()
"""


@pytest.mark.parametrize("view", ["mismatch", "unreadable"])
def test_processes_that_see_a_checkpoint_differently_agree_instead_of_waiting(tmp_path, view):
    outputs = mp_util.run_multiprocess(
        DIVERGENT_VIEW_SCRIPT,
        num_processes=2,
        local_devices=4,
        timeout=150,
        env={"CKPT_DIR": str(tmp_path), "CKPT_VIEW": view},
    )
    if view == "mismatch":  # both stop, process 0 told that the other process found it
        assert "MISMATCH 1 another state here" in outputs[1], outputs[1][-3000:]
        assert "MISMATCH 0 " in outputs[0] and "on another process" in outputs[0]
    else:  # both set step 2 aside and resume from step 1
        for i, out in enumerate(outputs):
            assert f"RESUMED {i} 1 1.0" in out, out[-3000:]
        assert (tmp_path / "corrupt" / "2").is_dir()


# Run in a child process: the file-size limit it sets would also break pytest's own files.
DISK_FULL_SCRIPT = """
import resource
import signal
import sys

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jia_jax import checkpoint
from tests.test_checkpoint import big_state

mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("node", "gpu"))
sharding = NamedSharding(mesh, P(("node", "gpu")))
ckpt = checkpoint.Checkpointer(sys.argv[1], max_to_keep=2, save_every_steps=1)
for step in (1, 2):
    ckpt.save(step, {"w": jax.device_put(big_state(step), sharding)}, {"step": step})
ckpt.wait()
# From here no file may grow past the limit: a write fails as on a full disk (EFBIG, not ENOSPC),
# deep in tensorstore's C++ writer, wherever orbax happens to be in the save.
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
try:
    with ckpt:
        ckpt.save(3, {"w": jax.device_put(big_state(3), sharding)}, {"step": 3})
        ckpt.wait()
except checkpoint.CheckpointWriteError as error:
    print("WRITE ERROR:", error)
"""


def big_state(step):
    """1 MiB of incompressible floats: more than the child's file-size limit."""
    return np.random.default_rng(step).standard_normal((256, 1024)).astype(np.float32)


def test_failed_write_names_the_directory_and_keeps_committed_checkpoints(mesh, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(mp_util.REPO_ROOT), JAX_PLATFORMS="cpu")
    child = subprocess.run(
        [sys.executable, "-c", DISK_FULL_SCRIPT, str(tmp_path)],
        check=False,
        cwd=mp_util.REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    message = child.stdout.partition("WRITE ERROR:")[2]
    assert f"checkpoint of step 3 to {tmp_path}:" in message, child.stdout + child.stderr[-3000:]
    assert "File too large" in message  # the OS's own words
    assert "checkpoints [1, 2] are intact" in message and "resume from step 2" in message

    # Keep-2 did not delete step 1 for the failed step 3, and step 2 restores bitwise.
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.isdigit()) == ["1", "2"]
    sharding = NamedSharding(mesh, P())
    abstract = {"w": jax.ShapeDtypeStruct((256, 1024), np.float32, sharding=sharding)}
    with checkpoint.Checkpointer(tmp_path, max_to_keep=2, save_every_steps=1) as ckpt:
        step, state, meta = ckpt.restore_latest(abstract)
        assert (step, meta) == (2, {"step": 2})
        assert_bitwise_equal(state, {"w": big_state(2)})
        # With space again, the rerun saves step 3 over the failed save's leftovers.
        assert ckpt.save(3, {"w": jax.device_put(big_state(3), sharding)}, {"step": 3})
        ckpt.wait()
        assert ckpt.all_steps() == [2, 3]
