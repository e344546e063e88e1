"""Tests for jia_jax.allreduce: bucketing round trip, mean per strategy and wire dtype, HLO."""

from __future__ import annotations

import json
import math
import re
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from jax.sharding import Mesh, PartitionSpec as P

from jia_jax import allreduce
from tests.mp_util import run_multiprocess

BF16 = np.dtype(jnp.bfloat16)
F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
WIRE_DTYPES = ("float32", "bfloat16", "float16")
# Leaf sizes 7, 90, 13, 24, 1: all but 24 not divisible by the 4 devices of a node; a scalar;
# a bf16 leaf.
LEAVES = {
    "bias": ((7,), F32),
    "conv": ((3, 3, 2, 5), F32),
    "head": {"b": ((13,), F32), "w": ((6, 4), BF16)},
    "scale": ((), F32),
}
# 128 bytes: in fp32 the buckets are [scale, head.w] [head.b] [conv] [bias], in 16-bit
# [scale, head.w, head.b] [conv] [bias]; conv is larger than a bucket in every wire dtype.
BUCKET_BYTES = 128
# Splits the buckets above into hierarchical (< 64 bytes) and flat ones for every wire dtype.
CROSSOVER_BYTES = 64
# Unit roundoff (half an ulp at 1) per dtype.
UNIT_ROUNDOFF = {F32: 2.0**-24, BF16: 2.0**-8, F16: 2.0**-11}
BATCH = P(("node", "gpu"))

INTRA_NODE = ((0, 1, 2, 3), (4, 5, 6, 7))
CROSS_NODE = ((0, 4), (1, 5), (2, 6), (3, 7))
ALL_DEVICES = ((0, 1, 2, 3, 4, 5, 6, 7),)


def _is_spec(x) -> bool:
    return isinstance(x, tuple) and len(x) == 2 and isinstance(x[1], np.dtype)


def per_device_grads(num_devices: int = 8, seed: int = 0) -> dict:
    """One gradient tree per device, stacked on a leading axis.

    Each element keeps its sign on every device and has magnitude in [1, 2], so the mean is at least 1
    in magnitude and relative tolerances are meaningful.
    """
    rng = np.random.default_rng(seed)

    def make(spec):
        shape, dtype = spec
        sign = rng.choice([-1.0, 1.0], size=shape)
        magnitude = rng.uniform(1.0, 2.0, size=(num_devices, *shape))
        return (sign * magnitude).astype(dtype)

    return jax.tree.map(make, LEAVES, is_leaf=_is_spec)


def all_combos_fn(mesh: Mesh):
    """Jitted function: per-device grads -> {"strategy/wire": mean grads with a per-device axis}.

    All 9 combinations share one compile. The per-device axis in the output lets the caller check
    that every device holds the mean.
    """

    def per_device(stacked):
        grads = jax.tree.map(lambda x: x[0], stacked)
        out = {}
        for strategy in allreduce.STRATEGIES:
            for wire in WIRE_DTYPES:
                mean = allreduce.reduce_gradients(
                    grads,
                    strategy=strategy,
                    bucket_bytes=BUCKET_BYTES,
                    wire_dtype=wire,
                    hybrid_crossover_bytes=CROSSOVER_BYTES,
                )
                out[f"{strategy}/{wire}"] = jax.tree.map(lambda x: x[None], mean)
        return out

    return jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=BATCH, out_specs=BATCH))


def check_means(outputs: dict, grads: dict) -> None:
    """Asserts every device's result equals the float64 mean of the per-device grads."""
    ref_leaves = [np.asarray(g, np.float64).mean(axis=0) for g in jax.tree.leaves(grads)]
    in_leaves = jax.tree.leaves(grads)
    assert sorted(outputs) == sorted(f"{s}/{w}" for s in allreduce.STRATEGIES for w in WIRE_DTYPES)
    for combo, tree in outputs.items():
        wire = np.dtype(jnp.dtype(combo.split("/")[1]))
        for out, ref, inp in zip(jax.tree.leaves(tree), ref_leaves, in_leaves):
            assert out.dtype == inp.dtype and out.shape == inp.shape, combo
            # All devices must agree bit for bit, or the replicas drift apart.
            np.testing.assert_array_equal(out, np.broadcast_to(out[:1], out.shape), err_msg=combo)
            # Pre-division and the cast to the wire dtype round once, the at most 7 additions of 8
            # terms of one sign once each, the cast back to the leaf dtype once: relative error
            # <= 8 u_wire + u_leaf (fp32 everywhere: 5.4e-7 < 1e-6; bf16 wire: 3.5e-2; fp16 wire:
            # 4.4e-3). A missing or doubled device contribution is off by > 6%.
            rtol = 8 * UNIT_ROUNDOFF[wire] + UNIT_ROUNDOFF[inp.dtype]
            np.testing.assert_allclose(
                np.asarray(out[0], np.float64), ref, rtol=rtol, atol=0, err_msg=combo
            )


@pytest.fixture(scope="module")
def mesh() -> Mesh:
    return Mesh(np.array(jax.devices()).reshape(2, 4), ("node", "gpu"))


def _abstract_grads():
    return jax.tree.map(lambda s: jax.ShapeDtypeStruct(*s), LEAVES, is_leaf=_is_spec)


@pytest.mark.parametrize("wire", WIRE_DTYPES)
def test_test_setup_has_multiple_buckets_an_oversized_leaf_and_both_hybrid_paths(wire):
    plan = allreduce.plan_buckets(_abstract_grads(), BUCKET_BYTES, wire)
    nbytes = plan.bucket_nbytes()
    assert len(plan.buckets) >= 3
    assert any(len(b) > 1 for b in plan.buckets)
    assert any(n > BUCKET_BYTES and len(b) == 1 for n, b in zip(nbytes, plan.buckets))
    assert any(s % 4 for s in plan.bucket_sizes())  # Hierarchical padding is exercised.
    assert min(nbytes) < CROSSOVER_BYTES <= max(nbytes)


def test_every_strategy_and_wire_dtype_returns_the_mean_on_every_device(mesh):
    grads = per_device_grads()
    outputs = jax.tree.map(np.asarray, all_combos_fn(mesh)(grads))
    check_means(outputs, grads)


def test_mean_through_two_processes_of_four_devices():
    # Two meshes over the same 8 devices of 2 processes: 2x4 (the node axis is the process) and
    # 1x8 (one node: the hierarchical strategies collapse to one all-reduce across processes).
    script = """
      import json
      import numpy as np
      from jax.sharding import Mesh, NamedSharding
      from tests import test_allreduce as t

      assert jax.process_count() == 2 and jax.local_device_count() == 4
      local = {}
      for shape in ((2, 4), (1, 8)):
        mesh = Mesh(np.array(jax.devices()).reshape(shape), ("node", "gpu"))
        sharding = NamedSharding(mesh, t.BATCH)
        grads = jax.tree.map(
            lambda x: jax.make_array_from_callback(x.shape, sharding, lambda i: x[i]),
            t.per_device_grads())
        outputs = t.all_combos_fn(mesh)(grads)
        # {shape: {combo: {mesh position: [leaf values]}}} for this process's devices (float32
        # is exact in JSON).
        for combo, tree in outputs.items():
          for leaf in jax.tree.leaves(tree):
            for shard in leaf.addressable_shards:
              values = np.asarray(shard.data, np.float32)[0].tolist()
              position = local.setdefault(str(shape), {}).setdefault(combo, {})
              position.setdefault(shard.index[0].start, []).append(values)
      print(json.dumps(local))
  """
    stdouts = run_multiprocess(script, num_processes=2, local_devices=4)
    grads = per_device_grads()
    merged: dict = {}
    for stdout in stdouts:
        for shape, combos in json.loads(stdout.strip().splitlines()[-1]).items():
            for combo, by_position in combos.items():
                merged.setdefault(shape, {}).setdefault(combo, {}).update(by_position)
    assert sorted(merged) == ["(1, 8)", "(2, 4)"]
    in_leaves = jax.tree.leaves(grads)
    for combos in merged.values():
        outputs = {}
        for combo, by_position in combos.items():
            assert sorted(by_position, key=int) == [str(i) for i in range(8)], combo
            leaves = [
                np.stack([np.asarray(by_position[str(d)][k], np.float32) for d in range(8)]).astype(
                    x.dtype
                )
                for k, x in enumerate(in_leaves)
            ]
            outputs[combo] = jax.tree.unflatten(jax.tree.structure(grads), leaves)
        check_means(outputs, grads)


# ---------------------------------------------------------------------------------------------
# HLO


_COLLECTIVE = re.compile(
    r"= (?P<type>\([^)]*\)|\S+) (?P<op>all-reduce|reduce-scatter|all-gather)(?:-start)?"
    r"\((?P<args>[^)]*)\).*?replica_groups="
    r"(?P<groups>\{[{}\d,]*\}|\[[\d,]+\]<=\[[\d,]+\](?:T\([\d,]+\))?|mesh\[[^\]]*\] \{[^}]*\})"
)


def _replica_groups(text: str) -> tuple[tuple[int, ...], ...]:
    """Parses the replica groups of an HLO collective into sorted tuples of device ids.

    XLA prints them as lists (`{{0,1},{2,3}}`), as an iota (`[2,2]<=[4]`, `[2,2]<=[2,2]T(1,0)`) or,
    from jax 0.11, as mesh axes (`mesh['node'=2,'gpu'=4] {'gpu'}`: devices that differ only in
    their gpu coordinate).
    """
    if text.startswith("{"):
        groups = [[int(d) for d in g.split(",")] for g in re.findall(r"\{([\d,]+)\}", text)]
    elif text.startswith("mesh"):
        mesh_text, group_text = re.fullmatch(r"mesh\[(.*)\] \{(.*)\}", text).groups()
        names, sizes = zip(*((n, int(s)) for n, s in re.findall(r"'(\w+)'=(\d+)", mesh_text)))
        grouped = [names.index(n) for n in re.findall(r"'(\w+)'", group_text)]
        others = [i for i in range(len(names)) if i not in grouped]
        ids = np.arange(math.prod(sizes)).reshape(sizes).transpose(others + grouped)
        groups = ids.reshape(-1, math.prod(sizes[i] for i in grouped)).tolist()
    else:
        match = re.fullmatch(r"\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", text)
        shape, dims, perm = ([int(d) for d in g.split(",")] if g else None for g in match.groups())
        ids = np.arange(math.prod(dims)).reshape(dims)
        groups = (ids.transpose(perm) if perm else ids).reshape(shape).tolist()
    return tuple(sorted(tuple(sorted(g)) for g in groups))


def _collectives(hlo: str) -> list[tuple[str, tuple, int, str]]:
    """(op, replica groups, number of operands, result type) for each collective instruction."""
    return [
        (m["op"], _replica_groups(m["groups"]), len(m["args"].split(",")), m["type"])
        for m in _COLLECTIVE.finditer(hlo)
    ]


def _reducer(strategy: str, wire: str, **options):
    """Per-device gradients -> their mean, with the test's bucket and crossover sizes and the
    other `reduce_gradients` `options`."""

    def per_device(g):
        return allreduce.reduce_gradients(
            g,
            strategy=strategy,
            bucket_bytes=BUCKET_BYTES,
            wire_dtype=wire,
            hybrid_crossover_bytes=CROSSOVER_BYTES,
            **options,
        )

    return per_device


def _stacked_reducer(mesh: Mesh, strategy: str, wire: str, **options):
    """`_reducer` over `mesh` of gradients stacked per device (`per_device_grads`)."""
    reduce = _reducer(strategy, wire, **options)
    return jax.shard_map(
        lambda g: reduce(jax.tree.map(lambda x: x[0], g)), mesh=mesh, in_specs=BATCH, out_specs=P()
    )


def _shard_map_eqns(fn, *args) -> list:
    """The equations of the one `shard_map` that `fn` traces to with `args`."""
    outer = jax.make_jaxpr(fn)(*args).jaxpr
    [inner] = [e.params["jaxpr"] for e in outer.eqns if e.primitive.name == "shard_map"]
    return getattr(inner, "jaxpr", inner).eqns  # a ClosedJaxpr in some JAX versions


def _hierarchical_buckets(strategy: str, plan) -> list[bool]:
    """Per bucket, whether `strategy` reduces it hierarchically: all for `hierarchical`, those
    under the crossover for `hybrid`."""
    return [
        n < CROSSOVER_BYTES if strategy == "hybrid" else strategy == "hierarchical"
        for n in plan.bucket_nbytes()
    ]


@pytest.mark.parametrize("strategy", allreduce.STRATEGIES)
def test_hlo_has_the_strategys_collectives_once_per_bucket(mesh, strategy):
    wire = "bfloat16"
    abstract = _abstract_grads()
    plan = allreduce.plan_buckets(abstract, BUCKET_BYTES, wire)
    hier = _hierarchical_buckets(strategy, plan)
    n_hier, n_flat = sum(hier), len(hier) - sum(hier)
    expected = Counter(
        {
            ("all-reduce", ALL_DEVICES): n_flat,
            ("reduce-scatter", INTRA_NODE): n_hier,
            ("all-reduce", CROSS_NODE): n_hier,
            ("all-gather", INTRA_NODE): n_hier,
        }
    )
    expected = +expected  # Drops zero counts.

    per_device = _reducer(strategy, wire)

    lowered = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=P(), out_specs=P())).lower(
        abstract
    )

    # Before optimization: one instruction per bucket and stage, carrying the wire dtype.
    pre = _collectives(lowered.as_text(dialect="hlo"))
    assert Counter((op, groups) for op, groups, _, _ in pre) == expected
    assert all(n == 1 and t.startswith("bf16[") for _, _, n, t in pre), pre
    # Reduce-scatter shards are the padded bucket split 4 ways.
    scattered = sorted(
        int(re.search(r"\[(\d+)\]", t)[1]) for op, _, _, t in pre if op == "reduce-scatter"
    )
    assert scattered == sorted(-(-s // 4) for s, h in zip(plan.bucket_sizes(), hier) if h)

    # After optimization XLA may combine several buckets into one tuple-shaped collective (the CPU
    # backend merges all-reduces) and moves bf16 collectives to f32 on CPU; the buckets carried per
    # stage are unchanged.
    post = _collectives(lowered.compile().as_text())
    carried = Counter()
    for op, groups, n, _ in post:
        carried[(op, groups)] += n
    assert carried == expected


# ---------------------------------------------------------------------------------------------
# Bucketing


_DTYPES = (F32, BF16, F16, np.dtype(np.int32))


@st.composite
def _trees(draw):
    shapes = draw(st.lists(st.lists(st.integers(0, 5), max_size=3).map(tuple), max_size=8))
    leaves = []
    for i, shape in enumerate(shapes):
        dtype = draw(st.sampled_from(_DTYPES))
        # Small integers are exact in every dtype, so the round trip must be exact whatever the wire.
        values = np.random.default_rng(i).integers(-64, 65, size=shape)
        leaves.append(jnp.asarray(values.astype(dtype)))
    split = draw(st.integers(0, len(leaves)))
    return {"a": leaves[:split], "b": {"c": tuple(leaves[split:])}}


@settings(max_examples=40, deadline=None)
@given(tree=_trees(), bucket_bytes=st.integers(0, 160), wire=st.sampled_from(WIRE_DTYPES))
def test_pack_unpack_round_trips_and_respects_the_bucket_limit(tree, bucket_bytes, wire):
    plan = allreduce.plan_buckets(tree, bucket_bytes, wire)
    leaves = jax.tree.leaves(tree)
    wire_dtype = np.dtype(jnp.dtype(wire))

    buckets = allreduce.pack(tree, plan)
    assert [b.shape for b in buckets] == [(n,) for n in plan.bucket_sizes()]
    assert all(b.dtype == wire_dtype for b in buckets)

    restored = allreduce.unpack(buckets, plan)
    assert jax.tree.structure(restored) == jax.tree.structure(tree)
    for got, want in zip(jax.tree.leaves(restored), leaves):
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))

    # Reverse leaf order, empty leaves skipped, each leaf contiguous and whole.
    order = [s.leaf for b in plan.buckets for s in b]
    assert order == [i for i in reversed(range(len(leaves))) if leaves[i].size]
    for bucket in plan.buckets:
        assert bucket, "empty bucket"
        offsets = np.cumsum([0] + [s.size for s in bucket])
        assert [s.offset for s in bucket] == offsets[:-1].tolist()
        assert [s.size for s in bucket] == [leaves[s.leaf].size for s in bucket]

    # Within the limit unless a lone oversized leaf; greedy: the next leaf did not fit.
    nbytes = plan.bucket_nbytes()
    for n, bucket in zip(nbytes, plan.buckets):
        assert n <= bucket_bytes or len(bucket) == 1
    for n, nxt in zip(nbytes, plan.buckets[1:]):
        assert n + nxt[0].size * wire_dtype.itemsize > bucket_bytes


def test_plan_rejects_negative_bucket_bytes():
    with pytest.raises(ValueError, match="comm.bucket_bytes"):
        allreduce.plan_buckets(_abstract_grads(), -1, "float32")


def test_first_bucket_has_its_own_limit():
    # Leaves of 3, 5, 2, 4, 6 fp32 elements packed last first (6, 4, 2, 5, 3): a 48-byte first
    # bucket takes 6 + 4 + 2 = 12 elements, then 24-byte buckets take 5 and 3 (5 + 3 > 6).
    tree = [jnp.zeros(n) for n in (3, 5, 2, 4, 6)]
    plan = allreduce.plan_buckets(tree, 24, "float32", first_bucket_bytes=48)
    assert [[s.leaf for s in b] for b in plan.buckets] == [[4, 3, 2], [1], [0]]
    # 0 keeps one limit for every bucket: 6, then 4 + 2, 5, 3.
    plan = allreduce.plan_buckets(tree, 24, "float32", first_bucket_bytes=0)
    assert [[s.leaf for s in b] for b in plan.buckets] == [[4], [3, 2], [1], [0]]
    with pytest.raises(ValueError, match="comm.first_bucket_bytes"):
        allreduce.plan_buckets(tree, 24, "float32", first_bucket_bytes=-1)


def test_last_bucket_has_its_own_limit_counted_from_the_end():
    # Leaves of 3, 5, 2, 4, 6 fp32 elements packed last first (6, 4, 2, 5, 3): a 32-byte last
    # bucket takes the last leaves within it, 5 + 3 (2 + 5 + 3 would not fit); 24-byte buckets
    # take the others from the front: 6, then 4 + 2.
    tree = [jnp.zeros(n) for n in (3, 5, 2, 4, 6)]
    plan = allreduce.plan_buckets(tree, 24, "float32", last_bucket_bytes=32)
    assert [[s.leaf for s in b] for b in plan.buckets] == [[4], [3, 2], [1, 0]]
    # A last leaf larger than the limit is the last bucket alone; with a first limit too, both
    # apply (a 40-byte first bucket: 6 + 4; then 2 and 5 apart, 7 values being over 24 bytes).
    plan = allreduce.plan_buckets(tree, 24, "float32", first_bucket_bytes=40, last_bucket_bytes=4)
    assert [[s.leaf for s in b] for b in plan.buckets] == [[4, 3], [2], [1], [0]]
    # A limit that holds every leaf leaves one bucket.
    plan = allreduce.plan_buckets(tree, 24, "float32", last_bucket_bytes=80)
    assert [[s.leaf for s in b] for b in plan.buckets] == [[4, 3, 2, 1, 0]]
    with pytest.raises(ValueError, match="comm.last_bucket_bytes"):
        allreduce.plan_buckets(tree, 24, "float32", last_bucket_bytes=-1)


def test_pack_rejects_a_tree_of_another_structure():
    plan = allreduce.plan_buckets({"a": jnp.zeros(3)}, 64, "float32")
    with pytest.raises(ValueError, match="structure"):
        allreduce.pack({"b": jnp.zeros(3)}, plan)


@pytest.mark.parametrize("strategy, message", [("ring", "comm.strategy"), ("xla", "XLA")])
def test_unknown_or_xla_strategy_is_rejected(strategy, message):
    with pytest.raises(ValueError, match=message):
        allreduce.reduce_gradients(
            {"w": jnp.zeros(3)},
            strategy=strategy,
            bucket_bytes=64,
            wire_dtype="float32",
            hybrid_crossover_bytes=64,
        )


def test_integer_gradients_are_rejected():
    with pytest.raises(TypeError, match="floating-point"):
        allreduce.reduce_gradients(
            {"w": jnp.zeros(3, jnp.int32)},
            strategy="flat",
            bucket_bytes=64,
            wire_dtype="float32",
            hybrid_crossover_bytes=64,
        )


def test_plan_follows_the_given_leaf_order_and_rejects_a_bad_one():
    tree = {"a": jnp.zeros(3), "b": jnp.zeros(5), "c": jnp.zeros(2)}
    plan = allreduce.plan_buckets(tree, bucket_bytes=0, wire_dtype="float32", leaf_order=[1, 2, 0])
    assert [b[0].leaf for b in plan.buckets] == [1, 2, 0]
    with pytest.raises(ValueError, match="permutation"):
        allreduce.plan_buckets(tree, bucket_bytes=0, wire_dtype="float32", leaf_order=[0, 0, 1])


# ---------------------------------------------------------------------------------------------
# Degenerate meshes and where the division happens


@pytest.mark.parametrize("shape", [(1, 8), (8, 1)])
@pytest.mark.parametrize("strategy", ["hierarchical", "hybrid"])
def test_one_level_meshes_reduce_each_bucket_with_one_all_reduce(shape, strategy):
    # With a single node (or a single GPU per node) reduce-scatter -> all-reduce -> all-gather
    # moves the bytes of one all-reduce in three launches; the strategy must issue just that one.
    mesh = Mesh(np.array(jax.devices()).reshape(shape), ("node", "gpu"))
    wire = "float32"
    plan = allreduce.plan_buckets(_abstract_grads(), BUCKET_BYTES, wire)

    per_device = _reducer(strategy, wire)

    # Under shard_map's replication check (its default), as the module docstring's example runs.
    fn = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=P(), out_specs=P()))
    pre = _collectives(fn.lower(_abstract_grads()).as_text(dialect="hlo"))
    assert Counter(op for op, _, _, _ in pre) == Counter({"all-reduce": len(plan.buckets)})
    assert all(groups == ALL_DEVICES for _, groups, _, _ in pre), pre

    grads = per_device_grads()
    # Per-device (varying) gradients in, a result the replication check accepts as replicated
    # over both axes out (a psum over the gpu axis alone would be typed as varying over node).
    mean = jax.jit(
        jax.shard_map(
            lambda s: per_device(jax.tree.map(lambda x: x[0], s)),
            mesh=mesh,
            in_specs=BATCH,
            out_specs=P(),
        )
    )(grads)
    for out, inp in zip(jax.tree.leaves(mean), jax.tree.leaves(grads)):
        ref = np.asarray(inp, np.float64).mean(axis=0)
        # 7 additions of same-sign terms in fp32, the division by 8 exact, one cast to the leaf
        # dtype: relative error <= 7 u_f32 + u_leaf.
        rtol = 7 * UNIT_ROUNDOFF[F32] + UNIT_ROUNDOFF[np.dtype(inp.dtype)]
        np.testing.assert_allclose(np.asarray(out, np.float64), ref, rtol=rtol, atol=0)


@pytest.mark.parametrize("wire", WIRE_DTYPES)
def test_the_mean_of_large_fp16_gradients_does_not_overflow(mesh, wire):
    # 8 devices x 40,960 sums to 327,680 > fp16's 65,504: an fp16 wire must divide first; fp32 and
    # bf16 wires sum (their range is fp32's) and divide after. Either way the mean is 40,960.
    grads = {"w": np.full((8, 16), 40960.0, np.float16)}

    def per_device(stacked):
        mean = allreduce.reduce_gradients(
            {"w": stacked["w"][0]},
            strategy="flat",
            bucket_bytes=BUCKET_BYTES,
            wire_dtype=wire,
            hybrid_crossover_bytes=CROSSOVER_BYTES,
        )
        return {"w": mean["w"][None]}

    out = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=BATCH, out_specs=BATCH))(grads)
    assert allreduce.divide_before_sum(wire) == (wire == "float16")
    # Every value on the way is exact in every wire dtype: 40,960 = 5 * 2^13, the partial sums
    # k * 40,960 (k <= 8) need at most 6 significant bits, the pre-divided 5,120 and its partial
    # sums are multiples of 1,024 below 65,504. So the mean must be exact, and an inf (a sum that
    # overflowed) or a halved value (a contribution lost) is caught.
    np.testing.assert_array_equal(np.asarray(out["w"], np.float64), 40960.0)


@pytest.mark.parametrize("strategy", allreduce.STRATEGIES)
@pytest.mark.parametrize("wire", WIRE_DTYPES)
def test_one_device_returns_its_gradients_untouched(strategy, wire):
    # Nothing to reduce: no bucket is packed (packing changed how XLA fused backward on a GPU)
    # and every leaf comes back bit for bit in its own dtype, fp16's pre-division included.
    one = Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("node", "gpu"))
    grads = jax.tree.map(lambda x: x[0], per_device_grads(num_devices=1))
    reduce = jax.jit(jax.shard_map(_reducer(strategy, wire), mesh=one, in_specs=P(), out_specs=P()))
    jaxpr = str(jax.make_jaxpr(reduce)(grads))
    assert "concatenate" not in jaxpr and "psum" not in jaxpr, jaxpr
    out = reduce(grads)
    for got, want in zip(jax.tree.leaves(out), jax.tree.leaves(grads)):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(np.asarray(got), want)


@pytest.mark.parametrize("strategy", allreduce.STRATEGIES)
def test_after_backward_holds_every_leaf_behind_one_barrier_and_keeps_the_mean(mesh, strategy):
    # comm.pack_after_backward: one optimization_barrier over all the gradients ahead of the
    # first packing (the values pass through unchanged), and the same mean to the bit as without.
    wire = "bfloat16"
    grads = per_device_grads()

    def barriers(after_backward):
        eqns = _shard_map_eqns(
            _stacked_reducer(mesh, strategy, wire, after_backward=after_backward), grads
        )
        names = [e.primitive.name for e in eqns]
        found = [i for i, n in enumerate(names) if n == "optimization_barrier"]
        # Those ahead of the first bucket; the overlap's own barrier follows the collectives.
        return [len(eqns[i].invars) for i in found if i < names.index("concatenate")]

    assert barriers(True) == [len(jax.tree.leaves(grads))]
    assert barriers(False) == []
    same = [
        jax.tree.leaves(jax.jit(_stacked_reducer(mesh, strategy, wire, after_backward=a))(grads))
        for a in (True, False)
    ]
    for a, b in zip(*same):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("wire", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("strategy", allreduce.STRATEGIES)
def test_unconcatenated_buckets_send_each_bucket_as_one_psum_of_its_leaves(mesh, strategy, wire):
    # comm.concatenate_buckets=False: a bucket reduced flat is a psum of its leaves (no
    # concatenate), a hierarchical one is concatenated for its reduce-scatter only. On the CPU's
    # all-reduce each element is summed over the same devices in the same order either way, so
    # the means agree to the bit with the concatenated buckets' (fp16: divided first in both).
    grads = per_device_grads()
    plan = allreduce.plan_buckets(_abstract_grads(), BUCKET_BYTES, wire)
    eqns = _shard_map_eqns(_stacked_reducer(mesh, strategy, wire, packed=False), grads)
    hierarchical = _hierarchical_buckets(strategy, plan)
    both = {"node", "gpu"}
    flat_psums = [e for e in eqns
                  if e.primitive.name.startswith("psum") and set(e.params["axes"]) == both]
    # JAX binds one psum per leaf (or one for all): XLA's combiner merges them.
    assert sum(len(e.invars) for e in flat_psums) == sum(
        len(b) for b, h in zip(plan.buckets, hierarchical) if not h
    )
    concatenates = [e for e in eqns if e.primitive.name == "concatenate"]
    # (a bucket of one leaf needs no concatenate in either form)
    assert len(concatenates) == sum(h and len(b) > 1 for b, h in zip(plan.buckets, hierarchical))
    assert any(not h and len(b) > 1 for b, h in zip(plan.buckets, hierarchical)) == (
        strategy != "hierarchical"
    )
    got, want = (
        jax.tree.leaves(jax.jit(_stacked_reducer(mesh, strategy, wire, packed=p))(grads))
        for p in (False, True)
    )
    for a, b in zip(got, want):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)


def test_pmean_packed_on_one_device_is_the_tree_and_packs_nothing():
    one = Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("node", "gpu"))
    tree = {"mean": jnp.arange(5, dtype=jnp.float32) / 3, "loss": jnp.float32(2.5)}
    fn = jax.jit(jax.shard_map(
        lambda t: allreduce.pmean_packed(t, ("node", "gpu")), mesh=one, in_specs=P(), out_specs=P()
    ))
    assert "concatenate" not in str(jax.make_jaxpr(fn)(tree))
    for got, want in zip(jax.tree.leaves(fn(tree)), jax.tree.leaves(tree)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_vectors_last_packs_the_kernels_in_order_then_the_vectors_and_holds_the_vectors():
    # Backward order (reversed tree order): e(vector) d c(vector) b a; kernels first, then the
    # vectors, each group in that order; only the vectors are held. Without it: the order itself.
    tree = {"a": jnp.zeros((2, 3)), "b": jnp.zeros(4), "c": jnp.zeros((5, 1)), "d": jnp.zeros(6),
            "e": jnp.zeros(())}
    plain = allreduce.plan_buckets(tree, 1 << 20, "float32")
    last = allreduce.plan_buckets(tree, 1 << 20, "float32", vectors_last=True)
    assert [s.leaf for s in plain.buckets[0]] == [4, 3, 2, 1, 0] and plain.held == ()
    assert [s.leaf for s in last.buckets[0]] == [2, 0, 4, 3, 1] and last.held == (4, 3, 1)
    # With a 24-byte last bucket the vectors (a scalar, 6 and 4 values) fill more than it.
    small = allreduce.plan_buckets(tree, 24, "float32", vectors_last=True)
    assert [[s.leaf for s in b] for b in small.buckets] == [[2], [0], [4], [3], [1]]


def test_reduce_gradients_refuses_what_it_cannot_average_before_any_collective():
    # Outside any shard_map: each refusal comes before the mesh axes are read.
    grads = {"w": jnp.ones((2,), jnp.float32)}
    kwargs = dict(bucket_bytes=1 << 20, wire_dtype=jnp.float32, hybrid_crossover_bytes=1 << 20)
    with pytest.raises(ValueError, match="leaves the all-reduce to XLA"):
        allreduce.reduce_gradients(grads, strategy="xla", **kwargs)
    with pytest.raises(ValueError, match="Unknown comm.strategy 'ring'"):
        allreduce.reduce_gradients(grads, strategy="ring", **kwargs)
    with pytest.raises(TypeError, match="floating-point leaves, got int32"):
        allreduce.reduce_gradients({"n": jnp.ones((2,), jnp.int32)}, strategy="flat", **kwargs)
