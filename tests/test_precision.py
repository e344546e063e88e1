"""Compute-dtype policy and dynamic loss scaling vs a numpy re-implementation."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jia_jax.lars import lars
from jia_jax.precision import (
    LossScaleState,
    all_finite,
    check_loss_scale,
    compute_dtype,
    init_loss_scale,
    needs_loss_scaling,
    scale_loss,
    select_joined,
    select_tree,
    unscale,
    update_loss_scale,
)


def test_compute_dtype_and_which_needs_scaling():
    assert compute_dtype("bfloat16") == jnp.bfloat16
    assert compute_dtype("float16") == jnp.float16
    assert compute_dtype("float32") == jnp.float32
    assert [needs_loss_scaling(compute_dtype(n)) for n in ("bfloat16", "float16", "float32")] == [
        False,
        True,
        False,
    ]
    with pytest.raises(ValueError, match=r"precision\.compute"):
        compute_dtype("fp16")


def ref_scale_sequence(pattern, initial, growth_interval, factor, minimum):
    """numpy reference of the dynamic loss-scale rule; returns the scale after each step."""
    scale, good, out = initial, 0, []
    for finite in pattern:
        if finite:
            good += 1
            if good == growth_interval:
                scale, good = scale * factor, 0
        else:
            scale, good = max(scale / factor, minimum), 0
        out.append((scale, good))
    return out


def test_scale_sequence_over_scripted_pattern():
    # Growth after 3 finite steps; overflows that halve it down to (and hold it at) the floor.
    pattern = [True] * 7 + [False] * 4 + [True, True, False] + [True] * 3 + [False]
    kwargs = dict(growth_interval=3, factor=2.0, minimum=64.0)
    step = jax.jit(lambda s, f: update_loss_scale(s, f, **kwargs))
    state = init_loss_scale(256.0)
    got = []
    for finite in pattern:
        state = step(state, jnp.asarray(finite))
        assert state.scale.dtype == jnp.float32 and state.good_steps.dtype == jnp.int32
        got.append((float(state.scale), int(state.good_steps)))
    want = ref_scale_sequence(pattern, 256.0, **kwargs)
    assert got == want  # powers of two: exact
    assert (
        min(s for s, _ in want) == 64.0 and max(s for s, _ in want) == 1024.0
    )  # both ends exercised


def test_static_scale_is_a_no_op():
    state = init_loss_scale(2.0**15, dynamic=False)
    assert float(state.scale) == 1.0
    for finite in (True, False, True):
        state = update_loss_scale(
            state, jnp.asarray(finite), growth_interval=1, factor=2.0, minimum=1.0, dynamic=False
        )
    assert float(state.scale) == 1.0 and int(state.good_steps) == 0
    loss = jnp.asarray(1.2345, jnp.float32)
    assert scale_loss(loss, state) == loss


def test_scale_then_unscale_is_exact_and_fp32():
    rng = np.random.default_rng(0)
    state = LossScaleState(
        scale=jnp.asarray(2.0**12, jnp.float32), good_steps=jnp.zeros([], jnp.int32)
    )
    grads = {
        "a": rng.normal(size=(3, 4)).astype(np.float16),
        "b": rng.normal(size=(5,)).astype(np.float32),
    }
    # Gradients of the scaled loss: g * scale, exact in fp16 (power of two, no overflow here).
    scaled = jax.tree.map(lambda g: jnp.asarray(g) * jnp.asarray(2.0**12, g.dtype), grads)
    out = unscale(scaled, state)
    for name in grads:
        assert out[name].dtype == jnp.float32
        np.testing.assert_array_equal(out[name], grads[name].astype(np.float32))  # bitwise
    assert float(scale_loss(jnp.asarray(0.75), state)) == 0.75 * 2.0**12


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_all_finite_flags_one_bad_leaf(bad):
    tree = {"a": jnp.ones((3,)), "b": {"c": jnp.zeros((2, 2), jnp.float16), "d": jnp.arange(4)}}
    assert bool(all_finite(tree))
    tree["b"]["c"] = tree["b"]["c"].at[1, 0].set(bad)
    assert not bool(jax.jit(all_finite)(tree))
    assert bool(all_finite({}))


def _grad_tree():
    """Gradient-shaped leaves of every rank the trainer has, fp32 and fp16, and an int counter."""
    rng = np.random.default_rng(0)
    return {
        "conv": {"kernel": rng.normal(size=(3, 3, 4, 8)).astype(np.float32)},
        "bn": {"scale": rng.normal(size=8).astype(np.float32), "bias": np.zeros(8, np.float32)},
        "dense": {"kernel": rng.normal(size=(8, 10)).astype(np.float16)},
        "scalar": np.float32(0.5),
        "count": np.int32(3),
    }


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
@pytest.mark.parametrize(
    "leaf", [("conv", "kernel"), ("bn", "bias"), ("dense", "kernel"), ("scalar",)]
)
def test_all_finite_finds_a_bad_element_in_a_leaf_of_any_rank(bad, leaf):
    tree = _grad_tree()
    assert bool(jax.jit(all_finite)(tree))
    *path, name = leaf
    parent = tree
    for key in path:
        parent = parent[key]
    value = np.array(parent[name])
    value.flat[value.size // 2] = bad
    parent[name] = value
    want = all(np.isfinite(np.asarray(x, np.float64)).all() for x in jax.tree.leaves(tree))
    assert not want and bool(jax.jit(all_finite)(tree)) == want


@pytest.mark.parametrize("part", [complex(np.inf, 0.0), complex(0.0, np.nan)])
def test_all_finite_checks_complex_leaves_whole(part):
    tree = {"k": np.ones((2, 2), np.complex64), "b": np.ones(2, np.float32)}
    assert bool(jax.jit(all_finite)(tree))
    tree["k"][1, 0] = part
    assert not bool(jax.jit(all_finite)(tree))


def test_all_finite_keeps_large_fp16_gradients_finite():
    # Squared in fp16, 6e4 would overflow (6e4**2 > 65504): the norm is taken in fp32.
    tree = {"k": np.full((64, 64), 6.0e4, np.float16), "b": np.full(4, 6.0e4, np.float16)}
    assert bool(jax.jit(all_finite)(tree))


def test_all_finite_adds_no_pass_over_the_kernels_lars_already_reduces():
    # XLA computes the norm of each kernel's gradient once for LARS's trust ratio and the check:
    # the update with the check compiles to at most two reductions more (the small leaves joined,
    # and the verdict), where a reduction per leaf added one per leaf (five here).
    tree = _grad_tree()
    params = {k: v for k, v in tree.items() if k in ("conv", "bn")}
    params["dense"] = {"kernel": np.ones((8, 10), np.float32), "bias": np.zeros(10, np.float32)}
    grads = jax.tree.map(lambda p: np.full(p.shape, 0.25, p.dtype), params)
    tx = lars(learning_rate=0.1, weight_decay=1e-4)
    opt_state = tx.init(params)

    def reductions(check: bool) -> int:
        def update(g, s, p):
            out = tx.update(g, s, p)
            return (*out, all_finite(g)) if check else out

        text = jax.jit(update).lower(grads, opt_state, params).compile().as_text()
        return len(re.findall(r"\breduce\(", text))

    without = reductions(False)
    assert without >= 4  # ||w|| and ||g|| of both kernels
    assert reductions(True) <= without + 2


def _stats_trees():
    """Two trees of the same leaves (shapes, dtypes), the awkward values a select must carry
    exactly: -0.0, a NaN with a payload, an int leaf, an empty leaf."""
    rng = np.random.default_rng(1)
    shapes = [(), (3,), (2, 4), (5,), (0,), (2,)]
    dtypes = [np.float32, jnp.bfloat16, np.float32, np.float32, np.float32, np.int32]
    payload_nan = np.array(0x7FC00123, np.uint32).view(np.float32)

    def tree(offset: float) -> dict:
        leaves = {}
        for i, (shape, dtype) in enumerate(zip(shapes, dtypes, strict=True)):
            value = np.asarray(rng.normal(size=shape) + offset).astype(dtype)
            if i == 3:
                value[:2] = (-0.0, payload_nan)
            leaves[f"l{i}"] = jnp.asarray(value)
        return leaves

    return tree(0.0), tree(10.0)


@pytest.mark.parametrize("pred", [False, True])
def test_select_joined_is_select_tree_bit_for_bit(pred):
    old, new = _stats_trees()
    got = jax.jit(select_joined)(jnp.asarray(pred), new, old)
    for want in (new if pred else old, jax.jit(select_tree)(jnp.asarray(pred), new, old)):
        assert jax.tree.structure(got) == jax.tree.structure(want)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            assert (a.dtype, a.shape) == (b.dtype, b.shape)
            assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


def test_select_joined_refuses_leaves_that_differ():
    old, new = _stats_trees()
    for changed in ({**old, "l2": old["l2"].astype(jnp.bfloat16)}, {**old, "l1": old["l1"][:2]}):
        with pytest.raises(ValueError, match="select_joined: an old leaf of"):
            select_joined(jnp.asarray(True), new, changed)


def test_select_joined_selects_each_dtype_once():
    # One select per dtype (three here), where select_tree has one per non-empty leaf (five).
    old, new = _stats_trees()
    pred = jnp.asarray(True)
    count = {
        f.__name__: jax.jit(f).lower(pred, new, old).as_text().count("stablehlo.select")
        for f in (select_joined, select_tree)
    }
    assert count == {"select_joined": 3, "select_tree": 5}


def test_select_tree_keeps_old_values_when_false():
    old = {"w": jnp.ones((2, 3), jnp.bfloat16), "count": jnp.asarray(4, jnp.int32)}
    new = {"w": jnp.full((2, 3), 7.0, jnp.bfloat16), "count": jnp.asarray(5, jnp.int32)}
    select = jax.jit(select_tree)
    kept, taken = select(jnp.asarray(False), new, old), select(jnp.asarray(True), new, old)
    for got, want in ((kept, old), (taken, new)):
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(np.asarray(a, np.float64), np.asarray(b, np.float64))


@pytest.mark.parametrize(
    "field,value", [("initial", 0.0), ("minimum", 0.0), ("factor", 1.0), ("growth_interval", 0)]
)
def test_a_loss_scale_that_cannot_move_names_its_field(field, value):
    cfg = {"initial": 2.0**15, "growth_interval": 2000, "factor": 2.0, "minimum": 1.0}
    check_loss_scale(cfg)  # the config's defaults: accepted
    with pytest.raises(ValueError, match=rf"precision\.loss_scale\.{field}="):
        check_loss_scale({**cfg, field: value})
