"""Buckets reduced under the next step's forward (`comm.deferred_buckets`): training with them
equals training without, bit for bit (settled in the middle or not, in the trainer's loop too); the
carried mean is `reduce_gradients`' own; in the step's program the carried buckets' all-reduce
needs no convolution of the step; the configs it cannot serve are refused."""

import functools
import re
import shutil

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from jia_jax import allreduce, deferred, models, optimizers, train
from jia_jax import mesh as mesh_lib
from jia_jax.models import call_order
from tests.main_util import run_main
from tests.test_metrics import read_scalars
from tests.test_overlap import WIRES, _closure, _grads, _instructions
from tests.test_resume import assert_bitwise_equal, read_state, resumed_step
from tests.test_train import IMAGE, build, global_batch, tiny_config

# A rate that moves every step: a deferred update applied with the wrong count, or a logged rate
# of the wrong step, shows.
SCHEDULE = optax.linear_schedule(0.05, 0.02, transition_steps=3)
ALL = 99  # more buckets than the tiny net has: every bucket deferred


def _batches() -> list[dict[str, np.ndarray]]:
    """Three different batches: `global_batch` with seeded noise on the images."""
    rng = np.random.default_rng(11)
    base = global_batch()
    return [
        {**base, "image": base["image"] + rng.normal(size=base["image"].shape).astype(np.float32)}
        for _ in range(3)
    ]


@functools.cache
def _setup(count: int):
    """(mesh, host initial state, step, plan) of the tiny net on a bf16 wire with `count` buckets
    deferred, `plan` its gradient buckets by `plan_buckets`; one compile of the step per count,
    shared by the tests."""
    mesh = mesh_lib.create_mesh(2, 4)
    config = tiny_config("flat")
    config.comm.dtype = "bfloat16"
    config.comm.deferred_buckets = count
    model, state, _ = build(config, mesh)
    tx = optimizers.create_optimizer(config.optimizer, SCHEDULE)
    step = train.make_train_step(model, tx, SCHEDULE, config, mesh)
    order = call_order.backward_leaf_order(model, (IMAGE, IMAGE, 1))
    plan = allreduce.plan_buckets(state.params, config.comm.bucket_bytes, "bfloat16", order)
    return mesh, jax.device_get(state.replace(opt_state=tx.init(state.params))), step, plan


def _begun(count: int):
    """A fresh initial state on the mesh, begun for the step of `count`, and that step."""
    mesh, initial, step, _ = _setup(count)
    state = jax.device_put(initial, mesh_lib.replicated_sharding(mesh))
    return step.begin(state, (IMAGE, IMAGE, 1)), step


def _sharded(count: int, batch: dict[str, np.ndarray]):
    """`batch` split over the devices of the mesh of `count`'s step."""
    mesh = _setup(count)[0]
    return {k: jax.device_put(v, mesh_lib.batch_sharding(mesh)) for k, v in batch.items()}


@functools.cache
def _train(count: int, settle_after: tuple[int, ...] = ()):
    """Three steps on `_batches`, settled after the steps in `settle_after` and at the end.

    Returns (state, metrics, carried, compiles): the final host state without its carry, every
    step's host metrics, the shapes of the unreduced buckets the last step carried, and the number
    of programs the step compiled.
    """
    state, step = _begun(count)
    metrics = []
    for i, batch in enumerate(_batches(), 1):
        state, m = step(state, _sharded(count, batch))
        metrics.append(jax.device_get(m))  # synced: few steps in flight on CPU
        if i in settle_after:
            state = step.settle(state)
    carried = [x.shape for x in state.deferred.local] if state.deferred is not None else []
    compiles = step.jitted._cache_size()
    state = step.settle(state)
    return jax.device_get(state.replace(deferred=None)), metrics, carried, compiles


def _assert_trees_equal(actual, expected):
    flat_a, tree_a = jax.tree.flatten(actual)
    flat_e, tree_e = jax.tree.flatten(expected)
    assert tree_a == tree_e
    for a, e in zip(flat_a, flat_e):
        np.testing.assert_array_equal(a, e)


def test_training_with_deferred_buckets_equals_training_without_bit_for_bit():
    # The same buckets, summed by the same collectives in the same wire dtype, then the same
    # optimizer ops on the same mean: only the program an update runs in moves, so every state
    # leaf and every step's metrics must be equal to the last bit.
    want, want_metrics, carried, _ = _train(0)
    assert carried == []
    # Not a trivial plan: `ALL` defers several buckets, 1 leaves several reduced.
    assert len(_setup(0)[3].buckets) >= 3
    for count in (1, ALL):
        got, got_metrics, carried, compiles = _train(count)
        _assert_trees_equal(got, want)
        for g, w in zip(got_metrics, want_metrics, strict=True):
            for key in ("loss", "top1", "learning_rate"):
                np.testing.assert_array_equal(g[key], w[key], err_msg=f"{count}: {key}")
        # The plan really deferred: the first buckets backward fills, one row per device.
        plan = _setup(count)[3]
        deferred_sizes = plan.bucket_sizes()[: min(count, len(plan.buckets))]
        assert carried == [(8, n) for n in deferred_sizes], (count, carried)
        # The carry comes out laid out as it went in: one program for the begun state and the
        # steps after it.
        assert compiles == 1, count


def test_settling_in_the_middle_changes_nothing_and_settling_twice_applies_once():
    # A checkpoint or an evaluation after step 2 settles there: the update of step 2 is applied
    # by `settle` instead of by step 3's program, the same ops on the same values.
    want, _, _, _ = _train(0)
    got, _, _, compiles = _train(1, settle_after=(2,))
    _assert_trees_equal(got, want)
    assert compiles == 1  # a settled carry keeps the step's layout: no second program
    # The carry still holds a step's gradients after `settle`, only no longer pending: a second
    # settle must not apply them again.
    state, step = _begun(1)
    state, _ = step(state, _sharded(1, _batches()[0]))
    settled = step.settle(state)
    once = jax.device_get(settled)  # fetched before the next settle donates it
    assert not once.deferred.pending
    assert any(np.any(x != 0) for x in once.deferred.local), "nothing that could be re-applied"
    twice = jax.device_get(step.settle(settled))
    _assert_trees_equal(twice, once)


BUCKET_BYTES, CROSSOVER = 256, 128  # several buckets, one leaf larger than a bucket; both sums


def test_carried_mean_equals_reduce_gradients_bit_for_bit():
    # `split_reduce` packs and sums `reduce_gradients`' buckets, and `mean` sums the carried ones
    # by the same collective before the same unpacking: the same mean to the last bit, for every
    # strategy, wire dtype and number of carried buckets (one program for all: one compile).
    mesh = mesh_lib.create_mesh(2, 4)
    stacked = _grads(np.random.default_rng(5), 8)
    shapes = {k: jax.ShapeDtypeStruct(v.shape[1:], v.dtype) for k, v in stacked.items()}
    plans = {w: allreduce.plan_buckets(shapes, BUCKET_BYTES, w) for w in WIRES}
    pairs = [(s, w) for s in allreduce.STRATEGIES for w in WIRES]
    cases = [(s, w, c) for s, w in pairs for c in (1, 2)]

    def per_device(g):
        g = jax.tree.map(lambda x: x[0], g)
        split = [deferred.split_reduce(g, plans[w], c, _comm(s)) for s, w, c in cases]
        plain = [
            allreduce.reduce_gradients(
                g, strategy=s, bucket_bytes=BUCKET_BYTES, wire_dtype=w,
                hybrid_crossover_bytes=CROSSOVER,
            )
            for s, w in pairs
        ]
        return split, plain

    def means(g):
        split, plain = jax.shard_map(
            per_device,
            mesh=mesh,
            in_specs=P(mesh_lib.BATCH_AXES),
            out_specs=([(P(mesh_lib.BATCH_AXES), P())] * len(cases), P()),
            check_vma=False,
        )(g)
        carried = [
            deferred.mean(
                deferred.Carry(jnp.array(True), local, reduced, plans[w], s, CROSSOVER), mesh
            )
            for (s, w, _), (local, reduced) in zip(cases, split)
        ]
        return carried, plain, [local for local, _ in split]

    carried, plain, locals_ = jax.device_get(jax.jit(means)(stacked))
    for (strategy, wire, count), mean, local in zip(cases, carried, locals_, strict=True):
        sizes = plans[wire].bucket_sizes()
        assert len(sizes) > 2 and [x.shape for x in local] == [(8, n) for n in sizes[:count]]
        u = {"float32": 2.0**-24, "bfloat16": 2.0**-8, "float16": 2.0**-11}[wire]
        for k in stacked:
            np.testing.assert_array_equal(mean[k], plain[pairs.index((strategy, wire))][k])
            # And it is the mean: within the wire's rounding of 8 terms (8 u of the largest
            # |term|), as in tests/test_overlap.py.
            reference = np.mean(stacked[k].astype(np.float64), axis=0)
            bound = 8 * u * np.max(np.abs(stacked[k]))
            assert np.max(np.abs(mean[k] - reference)) <= bound, (strategy, wire, count, k)


def _comm(strategy: str) -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict(
        {"strategy": strategy, "hybrid_crossover_bytes": CROSSOVER, "overlap": True}
    )


def _dataflow(hlo: str) -> dict[str, tuple[str, list[str]]]:
    """`_instructions` with calls followed (a shard_map body is a computation of its own): a call
    reads its computation's root, and a parameter of a called computation reads the call's
    operand of its index."""
    ins = _instructions(hlo)
    params, roots, calls = {}, {}, []
    computation = None
    for line in hlo.splitlines():
        if header := re.match(r"(?:ENTRY )?(\S+) \{$", line):
            computation = header.group(1)
        elif parameter := re.match(r"\s*(\S+) = .* parameter\((\d+)\)", line):
            params[computation, int(parameter.group(2))] = parameter.group(1)
        elif root := re.match(r"\s*ROOT (\S+) = ", line):
            roots[computation] = root.group(1)
        if call := re.match(r"\s*(?:ROOT )?(\S+) = .* call\(.*to_apply=([\w.-]+)", line):
            calls.append(call.groups())
    for name, callee in calls:
        for i, operand in enumerate(ins[name][1]):
            ins[params[callee, i]] = ("parameter", [*ins[params[callee, i]][1], operand])
        ins[name] = ("call", [roots[callee]])
    return ins


def _all_reduces(count: int) -> tuple[list[tuple[int, bool, set[str]]], int]:
    """The lowered train step of `count`, begun: for each all-reduce in program order, (its
    size, whether it depends on a convolution, the entry parameters it reads); and the size of the
    plan's first bucket."""
    state, step = _begun(count)
    hlo = step.lower(state, _sharded(count, global_batch())).as_text(dialect="hlo")
    ins = _dataflow(hlo)
    entry = hlo[hlo.index("\nENTRY ") :]
    inputs = set(re.findall(r"\n\s*(\S+) = [^\n]* parameter\(", entry))
    found = []
    for name, size in re.findall(r"\s(\S+) = \w+\[(\d+)\]\{0\} all-reduce\(", hlo):
        closure = _closure(ins, name)
        convolves = any(ins[n][0] == "convolution" for n in closure)
        found.append((int(size), convolves, closure & inputs))
    return found, _setup(count)[3].bucket_sizes()[0]


def test_the_carried_buckets_all_reduce_reads_only_the_carry():
    # The carried bucket's sum reads nothing but the carry, an input of the program, so XLA can
    # start it at the top, under forward; every bucket the step sums itself, and the BatchNorm
    # statistics with the metrics (the last all-reduce), wait for backward's convolutions.
    found, first = _all_reduces(1)
    sizes = _setup(1)[3].bucket_sizes()
    [(size, _, read)] = [f for f in found if not f[1]]
    # JAX names the program's inputs after their paths in the arguments (state.deferred.local).
    assert size == first and read and all("deferred_local" in n for n in read), read
    assert [f[0] for f in found if f[1]][:-1] == list(sizes[1:])
    # Without deferral the first bucket's sum depends on a convolution (the test can fail).
    found, first = _all_reduces(0)
    assert found[0][0] == first and all(convolves for _, convolves, _ in found)


@pytest.mark.parametrize(
    "count, strategy, compute",
    [(-1, "flat", "float32"), (1, "xla", "float32"), (1, "flat", "float16")],
)
def test_configs_deferral_cannot_serve_are_refused_naming_the_field(count, strategy, compute):
    # 'xla' has no buckets of the trainer's own to carry; fp16's loss scaling decides from every
    # gradient whether an update applies, so none could be applied before the carried ones.
    config = tiny_config(strategy)
    config.comm.deferred_buckets = count
    config.precision.compute = compute
    model = models.create_model(
        "resnet18", num_classes=10, dtype=jnp.float32,
        **{k: v for k, v in config.model.items() if k != "name"},
    )
    tx = optimizers.create_optimizer(config.optimizer, SCHEDULE)
    with pytest.raises(ValueError, match=r"comm\.deferred_buckets"):
        train.make_train_step(model, tx, SCHEDULE, config, mesh_lib.create_mesh(2, 4))


# The digits run of tests/main_util.py, shortened: checkpoints at 3 and 6, evaluations at 2 and 4
# (off the checkpoints, so the loop's own settle before an evaluation is what they read) and 6.
LOOP_FLAGS = (
    "--config=configs/digits.py",
    "--config.model.width=4",
    "--config.data.image_size=8",
    "--config.total_steps=6",
    "--config.optimizer.warmup_epochs=0.2",
    "--config.checkpoint_every_steps=3",
    "--config.eval_every_steps=2",
    "--config.log_every_steps=1",
    "--config.comm.strategy=flat",
    "--config.comm.bucket_bytes=4096",
)
TIMING = ("train/images_per_sec", "train/input_wait_fraction")


def _logged(workdir, after: int = 0) -> dict[tuple[str, int], float]:
    """The run's scalars after step `after`, but timings."""
    _, scalars = read_scalars(workdir)
    return {(t, s): v for (t, s), v in scalars.items() if t not in TIMING and s > after}


def test_the_loop_with_deferral_trains_evaluates_and_resumes_as_without(tmp_path, monkeypatch):
    # The runs share their compiles (the evaluation's, and all of the resumed run's) through
    # JAX's persistent cache: the trainers read it from the environment they inherit.
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "xla_cache"))
    monkeypatch.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    monkeypatch.setenv("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")
    runs = {}
    for name, count in (("plain", 0), ("deferred", 1)):
        runs[name] = tmp_path / name
        result = run_main(
            *LOOP_FLAGS, f"--config.comm.deferred_buckets={count}", f"--workdir={runs[name]}"
        )
        assert result.returncode == 0, result.stderr[-3000:]
    # Bit for bit as in the step's own test: every checkpoint, and every logged train metric and
    # evaluation (float32 in the event files).
    for step in (3, 6):
        assert_bitwise_equal(read_state(runs["deferred"], step), read_state(runs["plain"], step))
    logged = _logged(runs["deferred"])
    assert {("eval/loss", s) for s in (2, 4, 6)} <= logged.keys()
    assert logged == _logged(runs["plain"])

    # The deferred run's mid-run checkpoint resumes it: step 6 lost, the rerun starts at 3 and
    # ends where the uninterrupted run did.
    resumed = tmp_path / "resumed"
    shutil.copytree(runs["deferred"], resumed)
    shutil.rmtree(resumed / "checkpoints" / "6")
    for events in resumed.glob("events.out.tfevents.*"):
        events.unlink()  # what the rerun logs, alone
    result = run_main(*LOOP_FLAGS, "--config.comm.deferred_buckets=1", f"--workdir={resumed}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert resumed_step(result.stderr) == 3
    assert_bitwise_equal(read_state(resumed, 6), read_state(runs["deferred"], 6))
    assert _logged(resumed) == _logged(runs["deferred"], after=3)
