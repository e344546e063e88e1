"""The benchmark's peer steps compute the trainer's update: only the collectives differ."""

import jax
import numpy as np
import optax

from jia_jax import mesh as mesh_lib
from jia_jax import optimizers
from scripts.bench import peer_steps
from tests.test_train import LR, build, global_batch, tiny_config


def test_every_peer_step_equals_the_trainers_step():
    mesh = mesh_lib.create_mesh(2, 4)
    config = tiny_config("flat")
    model, state, step = build(config, mesh)
    batch = {k: jax.device_put(v, mesh_lib.batch_sharding(mesh)) for k, v in global_batch().items()}
    host = jax.device_get(state)
    ours = jax.device_get(step(state, batch)[0])
    schedule = optax.constant_schedule(LR)
    tx = optimizers.create_optimizer(config.optimizer, schedule)
    for kind in peer_steps.PEERS:
        peer = peer_steps.make_peer_step(kind, model, tx, schedule, config, mesh)
        theirs, metrics = peer(jax.device_put(host, mesh_lib.replicated_sharding(mesh)), batch)
        # Same fp32 gradients of the same 8 slices, averaged in another order (AD's psum, a
        # ravel, or fp32 buckets divided first): the means agree to a few u_f32 of the largest
        # term, and one SGD step at lr 0.05 scales that down further; 1e-6 absolute is far above
        # it and far below a missing or doubled device (a 1/8 change of the gradient).
        for tree in ("params", "batch_stats"):
            for a, b in zip(
                jax.tree.leaves(getattr(ours, tree)), jax.tree.leaves(getattr(theirs, tree))
            ):
                np.testing.assert_allclose(
                    np.asarray(a), np.asarray(b), rtol=0, atol=1e-6, err_msg=f"{kind} {tree}"
                )
        assert np.isfinite(float(metrics["loss"])), kind
