"""jia_jax.fp8_wire and the fp8 wire of the flat all-reduce: the mean against a float64 one,
within the two roundings to fp8 that the module documents, and one byte a value on the wire."""

from __future__ import annotations

import json
import re

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

from jia_jax import allreduce, bucketing, comm_model, fp8_wire, precision
from tests.mp_util import run_multiprocess
from tests.test_allreduce import per_device_grads

AXES = ("node", "gpu")
BATCH = P(AXES)
U = 2.0**-4  # float8_e4m3fn's unit roundoff: 3 significant bits after the leading one
FP8_MAX = 448.0  # its largest finite value, to which each chunk's largest magnitude is scaled
# Half the spacing of its subnormals (2^-9), in units of a chunk's scale.
SUBNORMAL = 2.0**-10


@pytest.fixture(scope="module")
def mesh() -> Mesh:
    return Mesh(np.array(jax.devices()).reshape(2, 4), AXES)


def per_device(mesh: Mesh, fn):
    """`fn` of each device's row under shard_map, the results stacked per device (not assumed
    equal: the tests compare them)."""
    return jax.jit(
        jax.shard_map(
            lambda x: fn(x[0])[None], mesh=mesh, in_specs=BATCH, out_specs=BATCH, check_vma=False
        )
    )


def rounding(values: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """The most that rounding `values` to fp8 in units of `scale` can change each one."""
    return np.maximum(U * np.abs(values), SUBNORMAL * scale)


def bound(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The float64 mean of `x` [n, E] over its rows and how far the fp8 mean may be from it:
    each device's chunk rounded once in its own scale, then the mean's chunk once in its own."""
    n, size = x.shape
    chunk = -(-size // n)
    padded = np.zeros((n, chunk * n))
    padded[:, :size] = x
    rows = padded.reshape(n, n, chunk)  # [sender, chunk, element]
    scales = np.abs(rows).max(axis=2, keepdims=True) / FP8_MAX
    mean = padded.mean(axis=0)
    first = rounding(rows, scales).mean(axis=0).reshape(-1)  # the received chunks' sum, / n
    first += 2.0**-20 * np.abs(padded).mean(axis=0)  # the fp32 sum of n terms, generously
    largest = (np.abs(mean) + first).reshape(n, chunk).max(axis=1, keepdims=True)
    second = rounding(np.abs(mean) + first, np.repeat(largest / FP8_MAX, chunk))
    return mean[:size], (first + second)[:size]


def test_the_mean_is_within_two_fp8_roundings_of_the_float64_mean(mesh):
    # Magnitudes over 7 decades (fp8's normals span 2^-6 to 448 of a scale, 4.5 decades; the
    # smallest then fall among its subnormals or to 0), mixed signs, a size 8 does not divide.
    rng = np.random.default_rng(0)
    size = 1003
    x = (rng.choice([-1.0, 1.0], (8, size)) * 10.0 ** rng.uniform(-7, 0, (8, size))).astype(
        np.float32
    )
    out = np.asarray(per_device(mesh, lambda b: fp8_wire.mean(b, AXES))(x))
    assert out.dtype == np.float32 and out.shape == (8, size)
    assert (out == out[0]).all()  # the same mean on every device, to the bit
    mean, allowed = bound(x.astype(np.float64))
    error = np.abs(out[0] - mean)
    assert (error <= allowed).all(), (error - allowed).max()
    assert error.max() > 2.0**-8 * np.abs(mean).max()  # rounded coarser than bfloat16 would


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_a_non_finite_gradient_reaches_the_mean_on_every_device(mesh, bad):
    x = np.ones((8, 64), np.float32)
    x[3, 21] = bad
    out = np.asarray(per_device(mesh, lambda b: fp8_wire.mean(b, AXES))(x))
    assert not np.isfinite(out[:, 21]).any()
    assert np.isfinite(np.delete(out, np.s_[16:24], axis=1)).all()  # other chunks are kept


def test_a_bucket_of_zeros_has_a_mean_of_zeros(mesh):
    out = np.asarray(per_device(mesh, lambda b: fp8_wire.mean(b, AXES))(np.zeros((8, 10))))
    assert (out == 0).all()


def test_the_wire_carries_one_byte_a_value_and_its_scales(mesh):
    size = 1003  # chunks of 126 values, 4 bytes of scale after each
    fn = per_device(mesh, lambda b: fp8_wire.mean(b, AXES))
    hlo = fn.lower(np.zeros((8, size), np.float32)).compile().as_text()
    received = {}  # per collective: (dtype, elements) of what each device ends with
    for result, op in re.findall(r"= (\(.*?\)|\S+) (all-to-all|all-gather|all-reduce)\(", hlo):
        for dtype, dims in re.findall(r"(\w+)\[([\d,]+)\]", result):
            count = int(np.prod([int(d) for d in dims.split(",")]))
            received[op] = (dtype, received.get(op, (dtype, 0))[1] + count)
    # The CPU backend splits the all-to-all into one operand per device: counted together.
    assert received == {"all-to-all": ("u8", 8 * 130), "all-gather": ("u8", 8 * 130)}, received


@pytest.mark.parametrize("strategy", ["flat", "hierarchical", "hybrid"])
def test_reduce_gradients_sends_an_fp8_wire_and_restores_each_leaf(mesh, strategy):
    grads = per_device_grads()

    def reduce(tree):
        # 64-value buckets; `hybrid` sends those under 48 bytes (values) hierarchically.
        return allreduce.reduce_gradients(
            tree, strategy=strategy, bucket_bytes=64, wire_dtype=bucketing.FP8_WIRE,
            hybrid_crossover_bytes=48,
        )

    fn = jax.jit(jax.shard_map(
        lambda t: jax.tree.map(lambda v: v[None], reduce(jax.tree.map(lambda v: v[0], t))),
        mesh=mesh, in_specs=BATCH, out_specs=BATCH, check_vma=False,
    ))
    out = fn(grads)
    for got, x in zip(jax.tree.leaves(out), jax.tree.leaves(grads), strict=True):
        got = np.asarray(got)
        assert got.dtype == x.dtype and got.shape == x.shape
        assert (got == got[0]).all()
        # Each element has one sign on every device and magnitude in [1, 2]: a chunk's scale is
        # at most 8 / 448 (a node's sum of 4), so a rounding is off by at most U times the value,
        # not by the subnormal term; the first by U |mean|, the second by U (1 + U) |mean| (the
        # sums inside a node are fp32: this tree's buckets hold fp32 leaves); a bf16 leaf is
        # rounded once more on its way back (2^-8).
        mean = np.asarray(x, np.float64).mean(axis=0)
        back = 2.0**-8 if x.dtype == jnp.bfloat16 else 2.0**-24
        allowed = (U * (2 + U) * (1 + back) + back) * np.abs(mean) * (1 + 2.0**-20)
        assert (np.abs(got[0].astype(np.float64) - mean) <= allowed).all()


def test_an_fp8_wire_is_refused_where_xla_would_sum_it():
    with pytest.raises(ValueError, match=r"comm\.dtype='float8_e4m3fn' needs one of the explicit"):
        precision.check_wire_dtype(bucketing.FP8_WIRE, jnp.bfloat16, "xla")
    for strategy in ("flat", "hierarchical", "hybrid", "auto"):
        precision.check_wire_dtype(bucketing.FP8_WIRE, jnp.bfloat16, strategy)
    with pytest.raises(ValueError, match=r"comm\.dtype='int8' must be one of"):
        precision.check_wire_dtype("int8", jnp.bfloat16, "flat")


def test_hierarchical_fp8_crosses_nodes_in_fp8_and_stays_in_the_gradients_dtype_inside(mesh):
    fn = per_device(mesh, lambda b: allreduce._fp8_mean(b, True, "node", "gpu"))
    hlo = fn.lower(jnp.zeros((8, 1003), jnp.bfloat16)).compile().as_text()
    found = re.findall(
        r"= (\(.*?\)|\S+) (all-to-all|all-gather|reduce-scatter|all-reduce)\(.*?"
        r"replica_groups=(\{[{}\d,]*\})",
        hlo,
    )
    across, inside = "{{0,4},{1,5},{2,6},{3,7}}", "{{0,1,2,3},{4,5,6,7}}"
    stages = sorted((op, groups, result.strip("(")[:2] == "u8") for result, op, groups in found)
    # Across the 2 nodes only a 1/4 shard (251 values, 126 a chunk), as fp8 bytes with its
    # scales, in one all-gather (two nodes: test below).
    assert stages == [("all-gather", inside, False), ("all-gather", across, True),
                      ("reduce-scatter", inside, False)], found


def test_between_two_devices_one_all_gather_and_one_rounding(mesh):
    # Over the node axis of the 2x4 mesh (pairs of devices): one all-gather of u8, no
    # all-to-all, and each value within one fp8 rounding of each device's chunk (in its own
    # scale) of the float64 mean, the same on both devices of a pair.
    rng = np.random.default_rng(4)
    size = 1003  # two chunks of 502 values a device
    x = (rng.choice([-1.0, 1.0], (8, size)) * 10.0 ** rng.uniform(-7, 0, (8, size))).astype(
        np.float32
    )
    fn = per_device(mesh, lambda b: fp8_wire.mean(b, "node"))
    out = np.asarray(fn(x))
    hlo = fn.lower(x).compile().as_text()
    assert re.findall(r"(all-to-all|all-gather|all-reduce)\(", hlo) == ["all-gather"]
    chunk = -(-size // 2)
    for gpu in range(4):
        pair = x[[gpu, 4 + gpu]].astype(np.float64)  # devices (node 0, gpu) and (node 1, gpu)
        assert (out[gpu] == out[4 + gpu]).all()
        padded = np.zeros((2, 2 * chunk))
        padded[:, :size] = pair
        rows = padded.reshape(2, 2, chunk)
        scales = np.abs(rows).max(axis=2, keepdims=True) / FP8_MAX
        allowed = rounding(rows, scales).mean(axis=0).reshape(-1)[:size]
        allowed += 2.0**-23 * np.abs(pair).mean(axis=0)  # the fp32 sum of two terms
        error = np.abs(out[gpu] - pair.mean(axis=0))
        assert (error <= allowed).all(), (gpu, (error - allowed).max())


def test_on_one_node_hierarchical_fp8_sends_no_fp8(mesh):
    one_node = Mesh(np.array(jax.devices()).reshape(1, 8), AXES)
    x = np.random.default_rng(2).normal(size=(8, 100)).astype(np.float32)
    out = np.asarray(per_device(one_node, lambda b: allreduce._fp8_mean(b, True, *AXES))(x))
    # An fp32 sum of 8 terms, not an fp8 rounding.
    np.testing.assert_allclose(out[0], x.astype(np.float64).mean(0), rtol=0, atol=8 * 2.0**-24 * 4)


def test_the_communication_model_plans_an_fp8_wire_across_nodes_at_a_byte_a_value():
    def plan(dtype: str, strategy: str) -> comm_model.Plan:
        comm = ml_collections.ConfigDict(
            {"dtype": dtype, "strategy": strategy, "bucket_bytes": 16 << 20,
             "hybrid_crossover_bytes": 0}
        )
        return comm_model.resolve(comm, node=2, gpu=4, leaf_sizes=[1 << 20] * 30)

    fp8 = plan(bucketing.FP8_WIRE, "auto")
    assert fp8.strategy == "hierarchical"
    assert fp8.exposed_s < plan("bfloat16", "hierarchical").exposed_s
    # On one device too: 'xla', which 'auto' picks there for other wires, would cast to fp8.
    comm = ml_collections.ConfigDict({"dtype": bucketing.FP8_WIRE, "strategy": "auto",
                                      "bucket_bytes": -1, "hybrid_crossover_bytes": -1})
    assert comm_model.resolve(comm, node=1, gpu=1, leaf_sizes=[10]).strategy == "hierarchical"
    with pytest.raises(ValueError, match="XLA's own all-reduce would sum in fp8"):
        allreduce.stacked_mean({"w": jnp.ones((2, 3))}, bucketing.FP8_WIRE)


def test_the_overlapped_fp8_mean_equals_the_plain_one_bit_for_bit(mesh):
    # The barrier that lets each bucket leave during backward is an identity on the reduced
    # buckets (`allreduce.hold_until_all_reduced`): the same chunks, scales and sums.
    grads = per_device_grads(seed=1)

    def reduce(tree, overlap):
        return allreduce.reduce_gradients(
            jax.tree.map(lambda v: v[0], tree), strategy="flat", bucket_bytes=64,
            wire_dtype=bucketing.FP8_WIRE, hybrid_crossover_bytes=0, overlap=overlap,
        )

    fn = jax.jit(jax.shard_map(
        lambda t: (reduce(t, False), reduce(t, True)),
        mesh=mesh, in_specs=BATCH, out_specs=P(), check_vma=False,
    ))
    plain, overlapped = jax.device_get(fn(grads))
    for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(overlapped), strict=True):
        np.testing.assert_array_equal(a, b)


def _exactly_summed(seed: int = 4, size: int = 301) -> np.ndarray:
    """Per-device rows of multiples of 2^-12 below 2 in magnitude, of mixed signs: any sum of a
    few of them is exact in fp32 (at most 14 significant bits), in whatever order the
    collectives add them; each still has more bits than fp8 keeps (4)."""
    rng = np.random.default_rng(seed)
    return (rng.integers(-8191, 8192, (8, size)) * 2.0**-12).astype(np.float32)


def test_two_processes_of_four_devices_get_the_one_process_mean_to_the_bit(mesh):
    # The node axis is the process, as across hosts: the all-to-alls and all-gathers cross
    # processes (gloo here, the network on GPUs); each device's mean is the one this process's
    # 2x4 mesh computes from the same rows, flat and hierarchical (whose sums inside a node the
    # processes may add in another order: the rows make every such sum exact).
    script = """
      import json
      import numpy as np
      from jax.sharding import Mesh, NamedSharding
      from jia_jax import allreduce
      from tests import test_fp8_wire as t

      mesh = Mesh(np.array(jax.devices()).reshape(2, 4), t.AXES)
      x = t._exactly_summed()
      rows = jax.make_array_from_callback(x.shape, NamedSharding(mesh, t.BATCH), lambda i: x[i])
      local = {}
      for hierarchical in (False, True):
        fn = t.per_device(mesh, lambda b: allreduce._fp8_mean(b, hierarchical, *t.AXES))
        for shard in fn(rows).addressable_shards:
          local.setdefault(str(hierarchical), {})[shard.index[0].start] = (
              np.asarray(shard.data, np.float32)[0].tolist())
      print(json.dumps(local))
  """
    merged: dict = {}
    for stdout in run_multiprocess(script, num_processes=2, local_devices=4):
        for form, by_device in json.loads(stdout.strip().splitlines()[-1]).items():
            merged.setdefault(form, {}).update(by_device)
    x = _exactly_summed()
    for hierarchical in (False, True):
        fn = per_device(mesh, lambda b, h=hierarchical: allreduce._fp8_mean(b, h, *AXES))
        expected = np.asarray(fn(x))
        assert (expected[0] != x.astype(np.float64).mean(axis=0)).any()  # rounded to fp8
        got = merged[str(hierarchical)]
        assert sorted(got, key=int) == [str(d) for d in range(8)]
        for device in range(8):
            np.testing.assert_array_equal(
                np.float32(got[str(device)]), expected[device], err_msg=f"device {device}"
            )


def test_the_fp8_wire_is_recognised_by_name_and_by_dtype():
    # One predicate for `comm.dtype` strings (config, communication model) and dtypes (plans).
    assert bucketing.is_fp8_wire("float8_e4m3fn") and bucketing.is_fp8_wire(jnp.float8_e4m3fn)
    assert bucketing.is_fp8_wire(jnp.dtype("float8_e4m3fn"))
    assert not any(map(bucketing.is_fp8_wire, ("bfloat16", jnp.dtype("float8_e5m2"), jnp.uint8)))
