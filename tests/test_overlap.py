"""Buckets reduced under backward (`comm.overlap`): the same mean bit for bit; in the train step's
program each bucket's all-reduce depends only on its own gradients, and its consumers wait behind
one barrier over every reduced bucket (what lets XLA start it early and wait for it late)."""

import os
import re

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

from jia_jax import allreduce, comm_model, xla_network
from jia_jax import mesh as mesh_lib
from jia_jax import train
from jia_jax.models import call_order
from tests.test_train import IMAGE, build, build_step, global_batch, tiny_config

WIRES = ("float32", "bfloat16", "float16")


def _grads(rng: np.random.Generator, devices: int) -> dict[str, np.ndarray]:
    """Per-device gradients stacked on a leading axis: leaves of several sizes and scales."""
    shapes = {"a": (7,), "b": (3, 5), "c": (64, 3), "d": (2, 2, 4, 8), "e": (33,)}
    return {
        k: (rng.normal(size=(devices, *s)) * 10.0 ** rng.integers(-3, 3)).astype(np.float32)
        for k, s in shapes.items()
    }


def test_overlapped_mean_equals_the_plain_one_bit_for_bit():
    # The barriers are identities on the reduced buckets (and the last one's gradients, and the
    # vectors), and a larger first bucket, a smaller last one or the vectors last only move
    # leaves between buckets: each value is summed over the same devices by the same collective
    # in the same wire dtype, so the mean is the same to the last bit, for every strategy and
    # wire dtype (one program for all of them: one compile).
    # Not for `hybrid` with other limits: a bucket that grows past the crossover, or shrinks below
    # it, is summed another way, another order of the same terms (still the mean, checked below).
    mesh = mesh_lib.create_mesh(2, 4)
    stacked = _grads(np.random.default_rng(0), 8)
    # (overlap, first_bucket_bytes, last_bucket_bytes, release_before_last, vectors_last)
    forms = ((False, 0, 0, False, False), (True, 0, 0, False, False), (True, 512, 0, False, False),
             (True, 0, 96, False, False), (True, 0, 0, True, False), (True, 0, 0, False, True),
             (True, 0, 96, True, True))
    cases = [(s, w, *f) for s in allreduce.STRATEGIES for w in WIRES for f in forms]

    def per_device(g):
        g = jax.tree.map(lambda x: x[0], g)
        return [
            allreduce.reduce_gradients(
                g,
                strategy=strategy,
                bucket_bytes=256,  # several buckets, one leaf larger than a bucket
                wire_dtype=wire,
                hybrid_crossover_bytes=128,
                overlap=overlap,
                first_bucket_bytes=first,
                last_bucket_bytes=last,
                release_before_last=release,
                vectors_last=vectors_last,
            )
            for strategy, wire, overlap, first, last, release, vectors_last in cases
        ]

    fn = jax.shard_map(
        per_device, mesh=mesh, in_specs=P(mesh_lib.BATCH_AXES), out_specs=P(), check_vma=False
    )
    means = dict(zip(cases, jax.device_get(jax.jit(fn)(stacked))))
    for strategy, wire, *_ in cases[:: len(forms)]:
        plain = means[strategy, wire, False, 0, 0, False, False]
        u = {"float32": 2.0**-24, "bfloat16": 2.0**-8, "float16": 2.0**-11}[wire]
        for k in stacked:
            # hybrid: where the plan is the default's
            hybrid_same = (f for f in forms[1:] if (f[1], f[2], f[4]) == (0, 0, False))
            for form in forms[1:] if strategy != "hybrid" else hybrid_same:
                np.testing.assert_array_equal(plain[k], means[strategy, wire, *form][k])
            # And it is the mean: within the wire's rounding of 8 terms (8 u of the largest
            # |term|).
            reference = np.mean(stacked[k].astype(np.float64), axis=0)
            bound = 8 * u * np.max(np.abs(stacked[k]))
            for form in forms:
                error = np.max(np.abs(means[strategy, wire, *form][k] - reference))
                assert error <= bound, (strategy, wire, form, k)


def _instructions(hlo: str) -> dict[str, tuple[str, list[str]]]:
    """name -> (opcode, operand names) of every instruction in HLO text."""
    out = {}
    for line in hlo.splitlines():
        m = re.match(r"\s*(?:ROOT )?(\S+) = .*? ([\w-]+)\((.*?)\)(?:,|$)", line)
        if m:
            out[m.group(1)] = (m.group(2), re.findall(r"[\w.-]+", m.group(3)))
    return out


def _closure(instructions, name: str) -> set[str]:
    seen, stack = set(), [name]
    while stack:
        n = stack.pop()
        if n not in seen:
            seen.add(n)
            stack.extend(o for o in instructions.get(n, ("", []))[1] if o in instructions)
    return seen


def _step_hlo(
    overlap: bool,
    first_bucket_bytes: int = 0,
    last_bucket_bytes: int = 0,
    release: bool = False,
    mesh_shape: tuple[int, int] = (2, 4),
    vectors_last: bool = False,
) -> str:
    """The HLO of the tiny train step on the 2x4 mesh, or `mesh_shape` (`flat`, several
    buckets; the vectors packed among the kernels unless `vectors_last`)."""
    mesh = mesh_lib.create_mesh(*mesh_shape)
    config = tiny_config("flat")
    config.comm.overlap = overlap
    config.comm.first_bucket_bytes = first_bucket_bytes
    config.comm.last_bucket_bytes = last_bucket_bytes
    config.comm.release_before_last = release
    config.comm.vectors_last = vectors_last
    _, state, step = build(config, mesh)
    batch = {k: jax.device_put(v, mesh_lib.batch_sharding(mesh)) for k, v in global_batch().items()}
    return step.lower(state, batch).as_text(dialect="hlo")


def test_each_bucket_leaves_with_its_gradients_and_is_awaited_after_all_of_them():
    hlo = _step_hlo(True)
    ins = _instructions(hlo)
    reduces = [n for n, (op, _) in ins.items() if op == "all-reduce"]
    # The gradient buckets, and the BatchNorm statistics with the metrics, are the all-reduces
    # of one concatenated 1-D bucket each.
    packed = [n for n in reduces if ins[ins[n][1][0]][0] == "concatenate"]
    # One barrier takes every gradient bucket's sum: whatever reads a sum waits for all of them;
    # the statistics' sum alone is not held.
    barriers = [n for n, (op, _) in ins.items() if op == "opt-barrier"]
    assert len(barriers) == 1, barriers
    held = {o for t in ins[barriers[0]][1] for o in ins[t][1]} | set(ins[barriers[0]][1])
    buckets = [n for n in packed if n in held]
    assert len(buckets) >= 3 and len(packed) == len(buckets) + 1, (packed, buckets)
    # The first bucket's all-reduce needs none of the last gradient backward makes: the stem
    # convolution's weight gradient (the 4x3x3x1 kernel, stored (out, h, w, in), of this tiny
    # ResNet-18's small-input stem).
    stem = re.findall(r"\s(\S+) = f32\[4,3,3,1\]\{[\d,]+\} convolution\(", hlo)
    assert stem, "no stem weight-gradient convolution"
    first_needs = [bool(set(stem) & _closure(ins, b)) for b in buckets]
    assert first_needs.count(False) == len(buckets) - 1 and first_needs.count(True) == 1
    # Without overlap no barrier holds the buckets (the test can fail).
    assert "opt-barrier" not in _step_hlo(False)


def test_vectors_last_ride_in_the_last_bucket_behind_one_barrier_of_their_own():
    # The trainer's default (`comm.vectors_last`): one barrier takes every vector gradient
    # (BatchNorm's scale and bias, the classifier's bias: the step's 1-D f32 leaves) and
    # nothing else, and only the last bucket reads it; the buckets before it need no vector,
    # so they still leave during backward. Without it every bucket reads vectors (can fail).
    hlo = _step_hlo(True, vectors_last=True)
    ins = _instructions(hlo)
    barriers = [n for n, (op, _) in ins.items() if op == "opt-barrier"]
    # The barriers of the tiny step take a tuple: the buckets' sums (overlap), or the vectors.
    taken = {b: [o for t in ins[b][1] for o in ins[t][1]] for b in barriers}
    [vectors] = [b for b in barriers if not any(ins[o][0] == "all-reduce" for o in taken[b])]
    tuple_text = re.search(rf"\s{re.escape(ins[vectors][1][0])} = \((.*?)\) tuple", hlo)[1]
    assert set(re.findall(r"f32\[(\d+)\]", tuple_text)) == {"10", "32", "16", "8", "4"}
    assert "," not in re.sub(r"\{[\d,]*\}|/\*index=\d+\*/|, ", "", tuple_text), tuple_text
    # The gradient buckets' sums, in bucket order: what the overlap's barrier takes.
    [sums] = [taken[b] for b in barriers if b != vectors]
    reading = [vectors in _closure(ins, n) for n in sums]
    config = tiny_config("flat")
    model, state, _ = build(config, mesh_lib.create_mesh(2, 4))
    plan = allreduce.plan_buckets(
        state.params, config.comm.bucket_bytes, config.comm.dtype,
        call_order.backward_leaf_order(model, (IMAGE, IMAGE, 1)), vectors_last=True,
    )
    with_vectors = [any(s.leaf in plan.held for s in b) for b in plan.buckets]
    assert reading == with_vectors and with_vectors.count(False) >= 2, reading
    # Without it no barrier holds the vectors, and the first bucket holds one (the classifier's
    # bias) among its kernels.
    plain = _step_hlo(True)
    assert plain.count(" opt-barrier(") == 1
    vectors_in = [[s.leaf for s in b if len(plan.shapes[s.leaf]) < 2] for b in plan.buckets]
    plain_plan = allreduce.plan_buckets(
        state.params, config.comm.bucket_bytes, config.comm.dtype,
        call_order.backward_leaf_order(model, (IMAGE, IMAGE, 1)),
    )
    assert any(len(plan.shapes[s.leaf]) < 2 for s in plain_plan.buckets[0]), plain_plan.buckets[0]
    assert sorted(sum(vectors_in, [])) == sorted(plan.held)


def test_release_before_last_holds_the_other_buckets_only_until_the_last_is_packed():
    # `comm.release_before_last`: one barrier takes every other bucket's sum and the last
    # bucket's packed gradients; the last bucket's all-reduce reads the barrier, so no other
    # bucket's sum (hence no update of its leaves) waits for the last all-reduce.
    hlo = _step_hlo(True, release=True)
    ins = _instructions(hlo)
    reduces = [n for n, (op, _) in ins.items() if op == "all-reduce"]
    packed = [n for n in reduces if ins[ins[n][1][0]][0] == "concatenate"]
    [barrier] = [n for n, (op, _) in ins.items() if op == "opt-barrier"]
    behind = _closure(ins, barrier)
    # The last gradient bucket alone leaves after the barrier, its packed gradients read through
    # it; the statistics' sum (the one packed all-reduce neither before nor after it) is not held.
    late = [n for n in reduces if barrier in _closure(ins, n)]
    held = [n for n in packed if n in behind]
    assert len(late) == 1 and len(held) >= 2 and len(packed) == len(held) + 1, (late, held)
    assert ins[ins[ins[late[0]][1][0]][1][0]][0] == "opt-barrier" and late[0] not in behind
    # Without it, every bucket's sum is behind the barrier (the test can fail).
    plain = _instructions(_step_hlo(True))
    [plain_barrier] = [n for n, (op, _) in plain.items() if op == "opt-barrier"]
    assert not any(plain_barrier in _closure(plain, n)
                   for n, (op, _) in plain.items() if op == "all-reduce")


def test_one_node_packing_after_backward_applies_no_last_bucket_and_no_release():
    # On one node the buckets are packed after backward ("auto"): a last bucket of its own and
    # the release before it serve only buckets that leave during backward, so the step is the
    # one without them; on two nodes (packed during backward) both change it (can fail).
    def hlo(mesh_shape, last, release):
        return _step_hlo(True, 0, last, release, mesh_shape)

    assert hlo((1, 8), 512, True) == hlo((1, 8), 0, False)
    assert hlo((2, 4), 512, False) != hlo((2, 4), 0, False)
    assert hlo((2, 4), 0, True) != hlo((2, 4), 0, False)


def test_the_step_packs_its_first_and_last_buckets_to_their_limits():
    # The trainer hands `comm.first_bucket_bytes` and `comm.last_bucket_bytes` to the packing:
    # the step's gradient all-reduces, in program order, have the sizes of `plan_buckets` with
    # those limits (and each limit changes the plan: the test can fail).
    mesh = mesh_lib.create_mesh(2, 4)
    config = tiny_config("flat")
    model, state, _ = build(config, mesh)
    order = call_order.backward_leaf_order(model, (IMAGE, IMAGE, 1))
    first = 10 * config.comm.bucket_bytes  # takes the 9216-element kernel after the fc
    last = 512  # the stem's kernel and BatchNorm (44 fp32 values)

    def planned(limits: tuple[int, int]) -> list[int]:
        plan = allreduce.plan_buckets(
            state.params, config.comm.bucket_bytes, config.comm.dtype, order, *limits
        )
        return list(plan.bucket_sizes())

    def compiled(limits: tuple[int, int]) -> list[int]:
        hlo = _step_hlo(True, *limits)
        sizes = re.findall(r"= \w+\[(\d+)\]\{0\} all-reduce\(", hlo)
        return [int(n) for n in sizes[:-1]]  # the last: BatchNorm statistics and metrics

    assert len({tuple(planned(limits)) for limits in ((first, 0), (0, last), (0, 0))}) == 3
    for limits in ((first, 0), (0, last), (0, 0)):
        assert compiled(limits) == planned(limits), limits


def test_start_when_ready_and_tell_xla_network_compile_the_step_with_buckets_apart(monkeypatch):
    # `comm.start_when_ready` reaches the step's jit: XLA's speed-of-light estimator (which turns
    # the latency-hiding scheduler on) off, concatenated buckets not combined (combining capped
    # at 16 MiB had joined a small last bucket to the one before it), buckets sent as their
    # leaves combined up to the bucket size;
    # `comm.tell_xla_network` the cap alone where XLA_FLAGS told the estimator the network (it
    # schedules each bucket where it is ready), nothing where they did not (one host);
    # nothing for 'xla' (no buckets of its own to keep apart).
    mesh = mesh_lib.create_mesh(2, 4)
    options = []
    jit = jax.jit

    def spy(fn, **kwargs):
        options.append(kwargs.get("compiler_options"))
        return jit(fn, **kwargs)

    monkeypatch.setattr(train.jax, "jit", spy)
    untold, link = os.environ.get("XLA_FLAGS", ""), comm_model.Link(1e-4, 6e9)
    assert xla_network.OPTION not in untold
    for concatenate, wire in ((True, "float32"), (False, "float32"), (False, "float8_e4m3fn")):
        cap = {  # an fp8 bucket is always concatenated
            f"xla_gpu_{kind}_combine_threshold_bytes": 4096 if wire == "float32" and not concatenate
            else 0
            for kind in ("all_reduce", "reduce_scatter", "all_gather")
        }
        no_sol = {**cap, "xla_gpu_enable_analytical_sol_latency_estimator": False}
        for strategy, ready, told, want in (
            ("flat", True, False, no_sol), ("flat", True, True, no_sol),
            ("flat", False, True, None), ("flat", False, False, None), ("xla", True, True, None),
        ):
            if strategy == "xla" and wire != "float32":
                continue  # XLA would sum fp8 in fp8: refused
            config = tiny_config(strategy)
            config.comm.start_when_ready = ready
            config.comm.tell_xla_network = told
            config.comm.concatenate_buckets = concatenate
            config.comm.dtype = wire
            monkeypatch.setenv("XLA_FLAGS", untold)
            build_step(config, mesh)  # its last jit is the train step's (none is compiled)
            assert options[-1] == want, (strategy, ready, told, concatenate, wire)
            monkeypatch.setenv("XLA_FLAGS", xla_network.with_estimator(untold, 4, link))
            build_step(config, mesh)
            told_flat = (strategy, ready, told) == ("flat", False, True)
            assert options[-1] == (cap if told_flat else want), (strategy, ready, told)
