"""Backward in parts (`comm.backward_cuts`): the models' segments compose to the whole net, the
staged gradients are one `jax.grad`'s, and in the train step's program each part's buckets are
packed before the part below runs backward (what lets their all-reduce start early)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jia_jax import loss as loss_lib
from jia_jax import mesh as mesh_lib
from jia_jax import staged_backward, train
from jia_jax.models import create_model
from tests.test_overlap import _closure, _instructions, step_hlo
from tests.test_train import assert_tree_close, build, global_batch, reference_step, tiny_config

SMALL = (16, 16, 3)


def _models():
    return [
        create_model("resnet18", num_classes=10, dtype="float32", width=4, small_inputs=True),
        # Dropout on: its masks must not depend on which segments run.
        create_model(
            "alexnet_bn",
            num_classes=10,
            dtype="float32",
            width=6,
            small_inputs=True,
            dropout_rate=0.5,
        ),
    ]


def _batch(n=4):
    rng = np.random.default_rng(0)
    return {
        "image": rng.normal(size=(n, *SMALL)).astype(np.float32),
        "label": rng.integers(0, 10, n).astype(np.int32),
    }


@pytest.mark.parametrize("model", _models(), ids=["resnet18", "alexnet_bn"])
def test_segments_run_in_turn_are_the_whole_net(model):
    x = _batch()["image"]
    variables = model.init(jax.random.key(0), x, train=False)
    rngs = {"dropout": jax.random.key(1)}
    whole, whole_vars = model.apply(variables, x, train=True, mutable=["batch_stats"], rngs=rngs)
    every_boundary = tuple(range(1, model.num_segments))
    names = staged_backward.model_parts(model, SMALL, every_boundary).names
    h, stats = x, {}
    for s in range(model.num_segments):
        h, new = model.apply(
            variables, h, train=True, start=s, stop=s + 1, mutable=["batch_stats"], rngs=rngs
        )
        stats.update({k: v for k, v in new["batch_stats"].items() if k in names[s]})
    # The same operations on the same values: equal, not merely close.
    np.testing.assert_array_equal(h, whole)
    assert jax.tree.structure(stats) == jax.tree.structure(whole_vars["batch_stats"])
    for a, b in zip(jax.tree.leaves(whole_vars["batch_stats"]), jax.tree.leaves(stats)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("model", _models(), ids=["resnet18", "alexnet_bn"])
def test_parts_hold_each_variable_once_and_bad_cuts_are_refused(model):
    parts = staged_backward.model_parts(model, SMALL, model.backward_cuts)
    variables = jax.eval_shape(
        lambda: model.init(jax.random.key(0), jnp.zeros((1, *SMALL)), train=False)
    )
    everything = set(variables["params"]) | set(variables["batch_stats"])
    assert sum(len(n) for n in parts.names) == len(everything)
    assert set().union(*parts.names) == everything
    assert all(parts.names), "a part without variables"
    for cuts in [(0,), (2, 2), (model.num_segments,), (3, 1)]:
        with pytest.raises(ValueError, match=r"comm.backward_cuts=.* must increase strictly"):
            staged_backward.model_parts(model, SMALL, cuts)
    with pytest.raises(ValueError, match=r"needs a model that runs ranges .* Dense does not"):
        staged_backward.model_parts(nn.Dense(3), SMALL, (1,))


def test_part_leaf_order_is_the_whole_order_restricted_to_the_part():
    params = {"a": {"k": 1, "b": 2}, "c": 3, "d": {"x": 4}}  # leaves a.b, a.k, c, d.x
    order = (3, 0, 2, 1)  # d.x, a.b, c, a.k
    assert staged_backward.part_leaf_order(params, order, frozenset({"a", "d"})) == (2, 0, 1)
    assert staged_backward.part_leaf_order(params, order, frozenset({"c"})) == (0,)


@pytest.mark.parametrize("model", _models(), ids=["resnet18", "alexnet_bn"])
def test_staged_gradients_are_one_grad_of_the_whole_net(model):
    batch = _batch()
    variables = model.init(jax.random.key(0), batch["image"], train=False)
    key, scale = jax.random.key(1), 8.0
    parts = staged_backward.model_parts(model, SMALL, model.backward_cuts)
    staged = staged_backward.staged_grads(model, jnp.float32, 0.1, parts)
    ties = []

    def send(i, grads, tie):
        ties.append((i, tie is None))
        return grads, tie

    def whole(p):
        logits, new = model.apply(
            {"params": p, "batch_stats": variables["batch_stats"]},
            batch["image"],
            train=True,
            mutable=["batch_stats"],
            rngs={"dropout": key},
        )
        loss = jnp.mean(loss_lib.cross_entropy(logits, batch["label"], 0.1))
        return loss * scale, (loss, new["batch_stats"])

    run = jax.jit(lambda p, s: staged(p, s, scale, batch, key, send))
    sent, stats, metrics = run(variables["params"], variables["batch_stats"])
    want, (loss, want_stats) = jax.jit(jax.grad(whole, has_aux=True))(variables["params"])
    # Sent top part first; only the bottom part has no cotangent to tie.
    n = len(parts.names)
    assert ties == [(i, i == 0) for i in reversed(range(n))]
    got = {k: v for part in sent for k, v in part.items()}
    assert jax.tree.structure(got) == jax.tree.structure(want)
    # A vjp per part is the chain rule cut where the whole grad passes the same cotangent: the
    # same fp32 operations, which may round differently only where XLA fuses them differently,
    # a few ulps (6e-8) of the gradient's scale per layer over ~10 layers: < 1e-6 of it. (Leaves
    # whose gradient is 0 in exact arithmetic, a BN bias before another BN, hold rounding noise
    # only, hence the bound on the whole gradient's scale, not each leaf's.)
    scale_of_all = max(float(np.max(np.abs(w))) for w in jax.tree.leaves(want))
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6 * scale_of_all)
    np.testing.assert_allclose(metrics["loss"], loss, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(stats), jax.tree.leaves(want_stats)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_cuts_apply_only_where_buckets_are_sent_and_stop_xlas_combining():
    config = tiny_config("flat")
    assert train.backward_cuts(config.comm) == () and train.compiler_options(config.comm) == {}
    config.comm.backward_cuts = (3, 4)
    assert train.backward_cuts(config.comm) == (3, 4)
    assert set(train.compiler_options(config.comm).values()) == {0}
    for field, value in [("overlap", False), ("strategy", "xla")]:
        changed = tiny_config("flat")
        changed.comm.backward_cuts = (3, 4)
        changed.comm[field] = value
        assert train.backward_cuts(changed.comm) == ()
        assert train.compiler_options(changed.comm) == {}


@pytest.mark.parametrize("strategy", ["flat", "hierarchical"])
def test_staged_step_equals_the_single_device_reference(strategy):
    # The whole train step with backward in three parts on the 2x4 mesh against the float64
    # reference of tests/test_train.py (its tolerances argued there).
    config = tiny_config(strategy)
    config.comm.backward_cuts = (3, 4)
    mesh = mesh_lib.create_mesh(2, 4)
    model, state, step = build(config, mesh)
    params0, stats0 = jax.device_get((state.params, state.batch_stats))
    batch = global_batch()
    sharded = {k: jax.device_put(v, mesh_lib.batch_sharding(mesh)) for k, v in batch.items()}
    new_state, _ = step(state, sharded)
    want_params, want_stats = reference_step(model, params0, stats0, batch, mesh.devices.size)
    assert_tree_close(new_state.params, want_params, rtol=1e-5, atol=1e-7)
    assert_tree_close(new_state.batch_stats, want_stats, rtol=1e-5, atol=1e-7)


def test_each_parts_buckets_are_packed_before_the_part_below_runs_backward():
    hlo = step_hlo(True, (3, 4))
    ins = _instructions(hlo)

    def barrier_inputs(barrier: str) -> set[str]:
        """What a barrier takes: the members of the tuple it is given."""
        return {o for t in ins[barrier][1] for o in ins[t][1]}

    reduces = [n for n, (op, _) in ins.items() if op == "all-reduce"]
    barriers = [n for n, (op, _) in ins.items() if op == "opt-barrier"]
    packed = {r: ins[r][1][0] for r in reduces}  # each all-reduce's bucket
    ties = {b for b in barriers if barrier_inputs(b) & set(packed.values())}
    # Two ties (cuts 3 and 4), and the barrier that holds every sum until all are done.
    assert len(ties) == 2 and len(barriers) == 3, (ties, barriers)
    tied = {r for r, bucket in packed.items() if any(bucket in barrier_inputs(b) for b in ties)}
    # The collectives read the buckets themselves, not a barrier's outputs (which XLA placed at
    # the end of backward), and the bottom part's buckets are tied to nothing.
    assert all(ins[bucket][0] != "get-tuple-element" for bucket in packed.values())
    assert tied and set(reduces) - tied
    # The weight gradient of the stem (the 3x3x1x4 kernel of this tiny ResNet-18's small-input
    # stem), backward's last, comes after both ties: the parts below wait for the buckets above
    # to be packed, not for their sums.
    stem = [
        n for n, (op, _) in ins.items() if op == "convolution" and f" {n} = f32[3,3,1,4]" in hlo
    ]
    assert stem, "no stem weight-gradient convolution"
    before_stem = _closure(ins, stem[0])
    assert ties <= before_stem and not set(reduces) & before_stem
    # Without cuts: the holding barrier only (the test can fail).
    plain = _instructions(step_hlo(True))
    assert [op for op, _ in plain.values()].count("opt-barrier") == 1
