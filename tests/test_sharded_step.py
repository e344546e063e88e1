"""The benchmark's sharded-update step (`scripts/bench/sharded_step.py`): its device-major bucket
layout is exact, a tiled reduce-scatter of it sums each leaf, and two of its steps on a 2x4 mesh
are LARS (You et al. 2017, Algorithm 1) in float64 on the mean gradient."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from jia_jax import allreduce
from jia_jax import mesh as mesh_lib
from jia_jax.models import call_order
from scripts.bench import sharded_step
from tests.test_overlap import _instructions
from tests.test_train import (
    F32_EPS, LARS_LR, assert_lars_step, global_batch, lars_setup, tiny_config,
)

SHAPES = {"a": (7,), "b": (3, 5), "c": (64, 3), "d": (2, 2, 4, 8), "e": (33,), "f": (0,)}


def _layout(devices: int) -> tuple[dict, sharded_step.ShardLayout]:
    rng = np.random.default_rng(1)
    tree = {k: rng.normal(size=(devices, *s)).astype(np.float32) for k, s in SHAPES.items()}
    one = jax.tree.map(lambda x: x[0], tree)
    plan = allreduce.plan_buckets(one, 256, "float32")  # several buckets, odd leaf sizes
    return tree, sharded_step.shard_layout(plan, devices)


@pytest.mark.parametrize("devices", [3, 8])
def test_buckets_round_trip_every_leaf_exactly(devices):
    tree, layout = _layout(devices)
    one = jax.tree.map(lambda x: x[0], tree)
    buckets = sharded_step.to_buckets(jax.tree.leaves(one), layout, jnp.float32)
    assert [b.size for b in buckets] == [devices * s for s in layout.shard_sizes]
    back = sharded_step.from_buckets(buckets, layout)
    for k in SHAPES:
        np.testing.assert_array_equal(back[k], one[k])


def test_tiled_reduce_scatter_gives_each_device_its_chunk_of_every_leafs_sum():
    mesh = mesh_lib.create_mesh(2, 4)
    tree, layout = _layout(8)

    def per_device(t):
        leaves = jax.tree.leaves(jax.tree.map(lambda x: x[0], t))
        shards = [
            jax.lax.psum_scatter(b, mesh_lib.BATCH_AXES, scatter_dimension=0, tiled=True)
            for b in sharded_step.to_buckets(leaves, layout, jnp.float32)
        ]
        full = [jax.lax.all_gather(s, mesh_lib.BATCH_AXES, tiled=True) for s in shards]
        squares = sharded_step.leaf_sums_of_squares(shards, layout)
        return sharded_step.from_buckets(full, layout), jax.lax.psum(squares, mesh_lib.BATCH_AXES)

    fn = jax.shard_map(per_device, mesh=mesh, in_specs=P(mesh_lib.BATCH_AXES),
                       out_specs=P(), check_vma=False)
    summed, squares = jax.device_get(jax.jit(fn)(tree))
    order = jax.tree.leaves({k: k for k in SHAPES})
    for i, k in enumerate(order):
        reference = np.sum(tree[k].astype(np.float64), axis=0)
        # 8 fp32 terms: 8 u_f32 of the largest |term| bounds the sum's rounding.
        bound = 8 * F32_EPS * np.max(np.abs(tree[k]), initial=0.0)
        np.testing.assert_allclose(summed[k], reference, rtol=0, atol=bound)
        # The shards' squares summed over the devices are the whole leaf's, padding adding 0.
        expected = np.sum(np.square(reference))
        assert squares[i] == pytest.approx(expected, rel=64 * F32_EPS, abs=1e-30), k


@pytest.mark.parametrize("replicated,hold", [(0, False), (2, True)])
def test_two_sharded_steps_are_float64_lars_on_the_mean_gradient(replicated, hold):
    """As `test_train.test_lars_step_on_the_mesh_matches_float64_algorithm1`, with the update
    sharded (all of it, or all but the first two buckets, which are all-reduced and updated
    whole, those behind the trainer's barrier): the reference's LARS in float64 on the mean of
    per-device fp32 gradients."""
    config, mesh, model, _, state = lars_setup("flat")
    step, shard = sharded_step.make_sharded_step(
        model, LARS_LR, config, mesh, state.params, (16, 16, 1), replicated, hold
    )
    sharded_state = shard(state)
    params, stats = jax.device_get((state.params, state.batch_stats))
    batch = global_batch()
    on_mesh = {k: jax.device_put(v, mesh_lib.batch_sharding(mesh)) for k, v in batch.items()}
    params = jax.tree.map(lambda w: np.asarray(w, np.float64), params)
    reference = params, jax.tree.map(np.zeros_like, params)
    layout = sharded_step.shard_layout(
        allreduce.plan_buckets(
            state.params, config.comm.bucket_bytes, config.comm.dtype,
            call_order.backward_leaf_order(model, (16, 16, 1)), config.comm.first_bucket_bytes,
        ),
        mesh.devices.size,
    )
    assert len(layout.shard_sizes) > replicated + 1  # some buckets of each kind
    for b, weights in enumerate(sharded_state.weights):  # whole where replicated
        assert weights.sharding.is_fully_replicated == (b < replicated)
    for t in range(2):
        sharded_state, metrics = step(sharded_state, on_mesh)
        got = [sharded_step.from_buckets(list(jax.device_get(x)), layout)
               for x in (sharded_state.weights, sharded_state.momentum)]
        reference = assert_lars_step(model, mesh, batch, stats, t, reference, got)
        assert int(sharded_state.count) == t + 1
        assert float(metrics["learning_rate"]) == pytest.approx(float(LARS_LR(t)))

def test_the_sharded_step_refuses_what_it_does_not_compute():
    config = tiny_config("flat")  # SGD
    mesh = mesh_lib.create_mesh(2, 4)
    with pytest.raises(ValueError, match="LARS"):
        sharded_step.make_sharded_step(None, optax.constant_schedule(0.1), config, mesh, {}, ())


def test_held_buckets_are_read_only_behind_one_barrier():
    # With `hold`, every reduced gradient bucket (the reduce-scatters and the first buckets'
    # all-reduces) goes into one barrier, as the trainer's do, so nothing reads a bucket before
    # all are reduced; without it no barrier exists (the test can fail).
    config, mesh, model, _, state = lars_setup("flat")
    batch = {k: jax.device_put(v, mesh_lib.batch_sharding(mesh)) for k, v in global_batch().items()}

    def lowered(hold: bool) -> str:
        step, shard = sharded_step.make_sharded_step(
            model, LARS_LR, config, mesh, state.params, (16, 16, 1), 2, hold
        )
        return step.lower(shard(state), batch).as_text(dialect="hlo")

    ins = _instructions(lowered(True))
    barriers = [n for n, (op, _) in ins.items() if op == "opt-barrier"]
    assert len(barriers) == 1, barriers
    held = {o for t in ins[barriers[0]][1] for o in ins[t][1]} | set(ins[barriers[0]][1])
    scatters = {n for n, (op, _) in ins.items() if op == "reduce-scatter"}
    reduces = {n for n, (op, _) in ins.items() if op == "all-reduce"}
    assert scatters and scatters <= held
    assert len(held & reduces) == 2  # the two buckets updated whole; not the norms, not the stats
    assert "opt-barrier" not in lowered(False)
