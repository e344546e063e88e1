"""LARS vs an independent float64 numpy implementation of You et al. 2017, Algorithm 1."""

import doctest
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jia_jax.lars import exclude_bias_and_norm, lars, scale_by_lars

ETA = 0.1  # trust coefficient large enough that updates are O(0.01), far from fp16 subnormals
WD = 1e-2
MOMENTUM = 0.9
STEPS = 20

SHAPES = {
    "conv": {"kernel": (3, 3, 4, 8)},
    "dense": {"kernel": (16, 10), "bias": (10,)},
    "bn": {"scale": (8,), "bias": (8,)},
}


def lr_schedule(count):
    """A learning rate that changes every step (jnp or numpy argument)."""
    return 0.1 + 0.05 * count


def random_tree(rng, dtype):
    """Standard-normal leaves of SHAPES in `dtype`."""
    return jax.tree.map(
        lambda s: jnp.asarray(rng.normal(size=s), dtype),
        SHAPES,
        is_leaf=lambda x: isinstance(x, tuple),
    )


def to64(tree):
    return jax.tree.map(lambda x: np.asarray(x, np.float64), tree)


def ref_direction(g, w, apply, wd, eta, eps=0.0):
    """local_lr * (g + wd * w), or g for masked-out leaves; float64."""
    if not apply:
        return g
    w_norm, g_norm = np.linalg.norm(w), np.linalg.norm(g)
    ratio = eta * w_norm / (g_norm + wd * w_norm + eps) if w_norm > 0 and g_norm > 0 else 1.0
    return ratio * (g + wd * w)


def ref_lars(grads, params, v, lr, mask, nesterov, eps=0.0):
    """Algorithm 1 on float64 pytrees: returns (updates to add to params, new momentum)."""
    d = jax.tree.map(lambda g, w, m: lr * ref_direction(g, w, m, WD, ETA, eps), grads, params, mask)
    v = jax.tree.map(lambda vi, di: MOMENTUM * vi + di, v, d)
    step = jax.tree.map(lambda vi, di: MOMENTUM * vi + di, v, d) if nesterov else v
    return jax.tree.map(np.negative, step), v


MASKED = [("dense", "bias"), ("bn", "scale"), ("bn", "bias")]  # ndim 1: plain momentum SGD


# Tolerance on returned updates, per params dtype: one rounding to that dtype (bf16 8 bits,
# fp16 11 bits, fp32 ~1e-6 after 20 steps of fp32 arithmetic). The atol covers fp32 rounding of
# O(0.1) terms that may cancel elementwise, and fp16 subnormal spacing (6e-8).
UPDATE_TOL = {jnp.float32: 1e-5, jnp.bfloat16: 4e-3, jnp.float16: 1e-3}
ATOL = 1e-6
# The momentum buffer is fp32 for every params dtype: fp32 tolerance.
MOMENTUM_TOL = 1e-5


@pytest.mark.parametrize(
    "dtype,nesterov",
    [(jnp.float32, False), (jnp.bfloat16, False), (jnp.float16, False), (jnp.float32, True)],
)
def test_lars_matches_float64_algorithm1(dtype, nesterov):
    rng = np.random.default_rng(0)
    tx = lars(
        lr_schedule, weight_decay=WD, trust_coefficient=ETA, momentum=MOMENTUM, nesterov=nesterov
    )
    params = random_tree(rng, dtype)
    state = tx.init(params)
    update = jax.jit(tx.update)
    mask = jax.tree.map(lambda s: len(s) > 1, SHAPES, is_leaf=lambda x: isinstance(x, tuple))
    ref_v = jax.tree.map(lambda p: np.zeros(p.shape), params)
    for t in range(STEPS):
        grads = random_tree(rng, dtype)
        updates, state = update(grads, state, params)
        # Both sides start from the same (dtype-rounded) params and grads each step.
        ref_updates, ref_v = ref_lars(
            to64(grads), to64(params), ref_v, lr_schedule(t), mask, nesterov
        )
        for ours, want, p in zip(
            jax.tree.leaves(updates),
            jax.tree.leaves(ref_updates),
            jax.tree.leaves(params),
            strict=True,
        ):
            assert ours.dtype == p.dtype
            np.testing.assert_allclose(
                np.asarray(ours, np.float64), want, rtol=UPDATE_TOL[dtype], atol=ATOL
            )
        for ours, want in zip(jax.tree.leaves(state.momentum), jax.tree.leaves(ref_v), strict=True):
            assert ours.dtype == jnp.float32
            np.testing.assert_allclose(ours, want, rtol=MOMENTUM_TOL, atol=ATOL)
        params = optax.apply_updates(params, updates)
    assert int(state.count) == STEPS


def test_masked_leaves_are_plain_momentum_sgd():
    rng = np.random.default_rng(1)
    params = random_tree(rng, jnp.float32)
    grad_seq = [random_tree(rng, jnp.float32) for _ in range(5)]

    def run(weight_decay, trust_coefficient):
        tx = lars(
            lr_schedule,
            weight_decay=weight_decay,
            trust_coefficient=trust_coefficient,
            momentum=MOMENTUM,
        )
        state, p, out = tx.init(params), params, []
        for g in grad_seq:
            u, state = tx.update(g, state, p)
            p = optax.apply_updates(p, u)
            out.append(u)
        return out

    a, b = run(WD, ETA), run(0.5, 3.0)
    v = {leaf: 0.0 for leaf in MASKED}
    for t, g in enumerate(grad_seq):
        for outer, inner in MASKED:
            # Weight decay and trust coefficient do not touch these leaves: bitwise equal updates.
            np.testing.assert_array_equal(a[t][outer][inner], b[t][outer][inner])
            # ...which follow v <- m*v + lr_t*g, w <- w - v (fp32 vs float64: rtol 1e-5).
            v[outer, inner] = MOMENTUM * v[outer, inner] + lr_schedule(t) * to64(g)[outer][inner]
            np.testing.assert_allclose(a[t][outer][inner], -v[outer, inner], rtol=1e-5, atol=1e-7)
    # The kernels, in contrast, do depend on the LARS settings.
    assert not np.allclose(a[-1]["conv"]["kernel"], b[-1]["conv"]["kernel"])


def test_fp16_grads_whose_squared_norm_overflows_fp16():
    rng = np.random.default_rng(2)
    w = jnp.asarray(rng.normal(0.0, 1.0, (8, 16)), jnp.float16)
    g = jnp.asarray(rng.normal(300.0, 10.0, (8, 16)), jnp.float16)
    # The premise: ||g||^2 ~ 1.2e7 is past fp16's max (65504).
    with np.errstate(over="ignore"):
        assert np.isinf(np.sum(np.asarray(g) ** 2, dtype=np.float16))
    tx = scale_by_lars(weight_decay=WD, trust_coefficient=0.001)
    out, _ = tx.update({"w": g}, tx.init({"w": w}), {"w": w})
    want = ref_direction(np.asarray(g, np.float64), np.asarray(w, np.float64), True, WD, 0.001)
    assert out["w"].dtype == jnp.float16
    assert np.all(np.isfinite(np.asarray(out["w"], np.float64)))
    # One fp16 rounding of the output: rtol 1e-3.
    np.testing.assert_allclose(np.asarray(out["w"], np.float64), want, rtol=1e-3)


def test_zero_weights_or_grads_give_ratio_one():
    rng = np.random.default_rng(3)
    w, g = (jnp.asarray(rng.normal(size=(4, 4)), jnp.float32) for _ in range(2))
    zeros = jnp.zeros((4, 4), jnp.float32)
    params = {"zero_w": zeros, "zero_g": w, "both": zeros}
    grads = {"zero_w": g, "zero_g": zeros, "both": zeros}
    tx = scale_by_lars(weight_decay=WD, trust_coefficient=ETA)
    out, _ = tx.update(grads, tx.init(params), params)
    assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(out))
    np.testing.assert_array_equal(out["zero_w"], grads["zero_w"])  # 1 * (g + wd * 0)
    np.testing.assert_allclose(out["zero_g"], WD * params["zero_g"], rtol=1e-6)  # 1 * (0 + wd * w)
    np.testing.assert_array_equal(out["both"], zeros)


def _optax_lars(nesterov, weight_decay):
    mask = exclude_bias_and_norm
    return optax.lars(
        lr_schedule,
        weight_decay=weight_decay,
        weight_decay_mask=mask,
        trust_ratio_mask=mask,
        trust_coefficient=ETA,
        momentum=MOMENTUM,
        nesterov=nesterov,
    )


@pytest.mark.parametrize("nesterov", [False, True])
def test_agrees_with_optax_lars_without_weight_decay(nesterov):
    # optax.lars also applies the (here changing) learning rate before its momentum trace, so
    # with weight_decay=0 the two are the same algorithm; fp32 rounding only (rtol 1e-5).
    rng = np.random.default_rng(4)
    ours = lars(
        lr_schedule, weight_decay=0.0, trust_coefficient=ETA, momentum=MOMENTUM, nesterov=nesterov
    )
    theirs = _optax_lars(nesterov, weight_decay=0.0)
    params = random_tree(rng, jnp.float32)
    s_ours, s_theirs = ours.init(params), theirs.init(params)
    for _ in range(5):
        grads = random_tree(rng, jnp.float32)
        u_ours, s_ours = ours.update(grads, s_ours, params)
        u_theirs, s_theirs = theirs.update(grads, s_theirs, params)
        for a, b in zip(jax.tree.leaves(u_ours), jax.tree.leaves(u_theirs), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
        params = optax.apply_updates(params, u_ours)


def test_differs_from_optax_lars_in_the_weight_decay_denominator():
    # With weight decay, optax's ratio is eta*||w||/||g + wd*w||; ours (and the paper's) is
    # eta*||w||/(||g|| + wd*||w||). First step (empty momentum), lr_schedule(0) = 0.1.
    rng = np.random.default_rng(5)
    wd = 0.5
    w = jnp.asarray(rng.normal(size=(6, 6)), jnp.float32)
    g = jnp.asarray(rng.normal(size=(6, 6)), jnp.float32)
    w64, g64, lr = np.asarray(w, np.float64), np.asarray(g, np.float64), lr_schedule(0)
    ours = lars(lr_schedule, weight_decay=wd, trust_coefficient=ETA)
    u_ours, _ = ours.update({"k": g}, ours.init({"k": w}), {"k": w})
    theirs = _optax_lars(nesterov=False, weight_decay=wd)
    u_theirs, _ = theirs.update({"k": g}, theirs.init({"k": w}), {"k": w})
    decayed = g64 + wd * w64
    paper = (
        -lr * ETA * np.linalg.norm(w64) / (np.linalg.norm(g64) + wd * np.linalg.norm(w64)) * decayed
    )
    optax_form = -lr * ETA * np.linalg.norm(w64) / np.linalg.norm(decayed) * decayed
    np.testing.assert_allclose(u_ours["k"], paper, rtol=1e-5)
    np.testing.assert_allclose(u_theirs["k"], optax_form, rtol=1e-5)
    assert not np.allclose(paper, optax_form, rtol=1e-2)


def test_callable_pytree_and_prefix_masks():
    rng = np.random.default_rng(6)
    params, grads = random_tree(rng, jnp.float32), random_tree(rng, jnp.float32)

    def everything(p):
        return jax.tree.map(lambda _: True, p)

    full_tree = {
        "conv": {"kernel": True},
        "dense": {"kernel": False, "bias": True},
        "bn": {"scale": False, "bias": False},
    }
    prefix = {"conv": True, "dense": False, "bn": True}
    for mask, expect in [
        (everything, everything(SHAPES)),
        (full_tree, full_tree),
        (
            prefix,
            {
                "conv": {"kernel": True},
                "dense": {"kernel": False, "bias": False},
                "bn": {"scale": True, "bias": True},
            },
        ),
    ]:
        tx = scale_by_lars(weight_decay=WD, trust_coefficient=ETA, mask=mask)
        out, _ = tx.update(grads, tx.init(params), params)
        want = jax.tree.map(
            lambda g, w, m: ref_direction(g, w, m, WD, ETA), to64(grads), to64(params), expect
        )
        for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(want), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)  # fp32 vs float64


def test_default_mask_works_on_abstract_params_and_state_is_fp32():
    params = jax.eval_shape(lambda: random_tree(np.random.default_rng(7), jnp.bfloat16))
    assert exclude_bias_and_norm(params) == {
        "conv": {"kernel": True},
        "dense": {"kernel": True, "bias": False},
        "bn": {"scale": False, "bias": False},
    }
    state = jax.eval_shape(lars(0.1).init, params)
    assert all(v.dtype == jnp.float32 for v in jax.tree.leaves(state.momentum))
    assert state.count.dtype == jnp.int32


def test_update_without_params_is_an_error():
    tx = lars(0.1)
    params = {"k": jnp.ones((2, 2))}
    with pytest.raises(ValueError, match="params"):
        tx.update(params, tx.init(params))


def test_docstring_examples_run():
    # The package re-exports the function `lars`, which shadows the submodule's attribute name.
    result = doctest.testmod(importlib.import_module("jia_jax.lars"))
    assert result.attempted > 0 and result.failed == 0


# A tree of leaves of varied sizes, a scalar, an empty leaf, bf16 and fp16 kernels, leaves with
# zero weights or gradients, and unmasked leaves between them: (shape, dtype, LARS mask).
VARIED = {
    "conv": ((3, 3, 8, 16), jnp.float32, True),
    "row_minus_1": ((3, 11, 31), jnp.float32, True),
    "row": ((32, 32), jnp.float32, True),
    "row_plus_1": ((5, 5, 41), jnp.float32, True),
    "wide": ((64, 70), jnp.float32, True),
    "bf16": ((5, 7, 9), jnp.bfloat16, True),
    "fp16": ((11, 13), jnp.float16, True),
    "scalar": ((), jnp.float32, True),
    "tiny": ((2, 1), jnp.float32, True),
    "empty": ((0, 5), jnp.float32, True),
    "zero_w": ((4, 6), jnp.float32, True),
    "zero_g": ((6, 4), jnp.float32, True),
    "bias": ((10,), jnp.float32, False),
    "bn_scale": ((8,), jnp.float16, False),
    "head": ((16, 3), jnp.bfloat16, False),
}
VARIED_MASK = {k: m for k, (_, _, m) in VARIED.items()}
VARIED_EPS = 0.5  # comparable to the small leaves' ||g||: a dropped or misplaced eps shows
# fp32 error bound. ||x||^2 of a leaf is a sum of N nonnegative terms: each square rounds once and
# any summation order has relative error <= (N - 1) * u (u = 2^-24, no cancellation), so N * u
# with the squaring. The square root halves it; the ratio divides one norm by a sum of positive
# terms (relative error <= the larger of its parts') and rounds at most 4 more times, and the
# direction `ratio * lr * (g + wd * w)` 3 more: (N + 7) * u in all, N <= 4480 here. (Pairwise or
# blocked summation, which XLA does, typically gives ~sqrt(N) * u; the bound is the worst case.)
FP32_TOL = (max(int(np.prod(s)) for s, _, _ in VARIED.values()) + 7) * 2.0**-24
# One more rounding, to the leaf's dtype (unit roundoff: bf16 2^-8, fp16 2^-11), on top.
VARIED_TOL = {
    jnp.float32: FP32_TOL,
    jnp.bfloat16: 2.0**-8 + FP32_TOL,
    jnp.float16: 2.0**-11 + FP32_TOL,
}


def varied_tree(rng, zero):
    """Standard-normal leaves of VARIED in their dtypes; the leaf named `zero` is all zeros."""
    return {
        k: jnp.asarray(np.zeros(s) if k == zero else rng.normal(size=s), dtype)
        for k, (s, dtype, _) in VARIED.items()
    }


def assert_close_per_dtype(ours, want, atol):
    for k, (_, dtype, _) in VARIED.items():
        assert ours[k].dtype == dtype, k
        np.testing.assert_allclose(
            np.asarray(ours[k], np.float64), want[k], rtol=VARIED_TOL[dtype], atol=atol, err_msg=k
        )


def test_scale_by_lars_on_varied_leaves_matches_float64_algorithm1():
    rng = np.random.default_rng(8)
    params, grads = varied_tree(rng, "zero_w"), varied_tree(rng, "zero_g")
    tx = scale_by_lars(weight_decay=WD, trust_coefficient=ETA, mask=VARIED_MASK, eps=VARIED_EPS)
    out, _ = jax.jit(tx.update)(grads, tx.init(params), params)
    want = jax.tree.map(
        lambda g, w, m: ref_direction(g, w, m, WD, ETA, VARIED_EPS),
        to64(grads),
        to64(params),
        VARIED_MASK,
    )
    # `g + wd * w` may cancel in an element: an absolute term of the relative bound times |g|, |w|.
    assert_close_per_dtype(out, want, atol=FP32_TOL * 10.0)
    # Zero norms give ratio 1, so the outputs are g + wd * w themselves.
    np.testing.assert_array_equal(out["zero_w"], grads["zero_w"])
    assert out["empty"].shape == (0, 5)


@pytest.mark.parametrize("nesterov", [False, True])
def test_lars_on_varied_leaves_matches_float64_algorithm1(nesterov):
    rng = np.random.default_rng(9)
    tx = lars(
        lr_schedule,
        weight_decay=WD,
        trust_coefficient=ETA,
        momentum=MOMENTUM,
        nesterov=nesterov,
        mask=VARIED_MASK,
        eps=VARIED_EPS,
    )
    params = varied_tree(rng, "zero_w")
    state, update = tx.init(params), jax.jit(tx.update)
    v = {k: np.zeros(s) for k, (s, _, _) in VARIED.items()}
    v_abs = dict(v)  # the same recursion on |direction|: what cancellation in v can cost
    for t in range(3):
        grads = varied_tree(rng, "zero_g")
        updates, state = update(grads, state, params)
        g64, w64 = to64(grads), to64(params)
        want, v = ref_lars(g64, w64, v, lr_schedule(t), VARIED_MASK, nesterov, VARIED_EPS)
        v_abs = {
            k: MOMENTUM * v_abs[k]
            + np.abs(
                lr_schedule(t) * ref_direction(g64[k], w64[k], VARIED_MASK[k], WD, ETA, VARIED_EPS)
            )
            for k in VARIED
        }
        # Each term of v carries the fp32 relative bound; terms of either sign may cancel, so the
        # absolute error is bounded by that bound times the sum of the terms' magnitudes.
        atol = FP32_TOL * 2 * max(np.max(x, initial=0.0) for x in v_abs.values())
        assert_close_per_dtype(updates, want, atol)
        for k in VARIED:
            assert state.momentum[k].dtype == jnp.float32
            np.testing.assert_allclose(state.momentum[k], v[k], rtol=FP32_TOL, atol=atol)
        params = optax.apply_updates(params, updates)


def test_lars_with_no_masked_leaves_or_only_empty_ones():
    params = {"b": jnp.ones(3), "s": jnp.ones(()), "e": jnp.ones((0, 4))}
    grads = jax.tree.map(lambda p: 2.0 * p, params)
    for mask in [False, {"b": False, "s": False, "e": True}]:
        tx = scale_by_lars(weight_decay=WD, trust_coefficient=ETA, mask=mask)
        out, _ = jax.jit(tx.update)(grads, tx.init(params), params)
        for k in params:
            np.testing.assert_array_equal(out[k], grads[k])


def test_create_optimizer_refuses_a_lars_trust_coefficient_of_zero():
    # eta = 0 would make every LARS layer's step 0: the kernels would never train.
    from configs import resnet50_64k
    from jia_jax import optimizers

    opt = resnet50_64k.get_config().optimizer
    assert opt.name == "lars"
    optimizers.create_optimizer(opt, optax.constant_schedule(0.1))  # the config's own: accepted
    opt.trust_coefficient = 0.0
    with pytest.raises(ValueError, match=r"optimizer\.trust_coefficient=0\.0"):
        optimizers.create_optimizer(opt, optax.constant_schedule(0.1))
