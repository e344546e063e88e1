"""scripts/bench/pack_fusion.py: its fusion count and the patches its variants compile."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

from jia_jax import allreduce
from scripts.bench import pack_fusion

_HLO = """HloModule m

%fused_select (p: f32[4]) -> f32[4] {
  %loop_select_fusion.9 = f32[4] parameter(0)
}

ENTRY %main (a: f32[4]) -> f32[4] {
  %loop_select_fusion.3 = f32[4] fusion(%a), kind=kLoop, calls=%fused_select
  %input_reduce_select_fusion = f32[] fusion(%a), kind=kInput, calls=%r
  %loop_select_fusion = f32[4] fusion(%a), kind=kLoop, calls=%fused_select
  %copy.1 = f32[4] copy(%a)
}
"""


def test_fusion_kinds_counts_the_entry_computations_fusions_by_kind():
    assert pack_fusion.fusion_kinds(_HLO) == {"loop_select": 2, "input_reduce_select": 1}


def _grads():
    rng = np.random.default_rng(0)
    shapes = {"a": (3, 5), "b": (7,), "c": (2, 2, 4), "d": (11,)}
    return {k: jnp.asarray(rng.normal(size=s), jnp.float32) for k, s in shapes.items()}


def _reduce(mesh: Mesh, variant: str):
    """The reduction as the trainer calls it with the variant's `comm` settings."""
    comm = pack_fusion.VARIANT_COMM[variant]
    after = comm.get("pack_after_backward") == "always"

    def per_device(g):
        return allreduce.reduce_gradients(
            g, strategy="flat", bucket_bytes=100, wire_dtype="float32", hybrid_crossover_bytes=0,
            after_backward=after, packed=comm.get("concatenate_buckets", True),
            vectors_last=comm.get("vectors_last", False),
        )

    return jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=P(), out_specs=P()))


@pytest.mark.parametrize(
    "variant, barriers",
    [("flat", 0), ("flat_packed", 0), ("flat_grad_barrier", 1), ("flat_leaves", 0),
     ("flat_vectors_last", 1)],
)
def test_variants_compile_what_they_say_and_keep_the_values(variant, barriers):
    one = Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("node", "gpu"))
    grads = _grads()
    plan = allreduce.plan_buckets(grads, 100, "float32")
    # [d] [c, b] [a]: one barrier over all differs from one each; vectors last: [c] [a] [d, b].
    assert len(plan.buckets) == 3
    with pack_fusion._variant_patch(variant):
        reduce = _reduce(one, variant)
        jaxpr = str(jax.make_jaxpr(reduce)(grads))
        out = reduce(grads)
    # On one device the trainer packs nothing; every other variant packs (one bucket of two),
    # into one array unless it sends the leaves.
    assert jaxpr.count("concatenate") == (0 if variant in ("flat", "flat_leaves") else 1), jaxpr
    assert ("psum" in jaxpr) == (variant != "flat"), jaxpr
    assert jaxpr.count("optimization_barrier") == barriers, jaxpr
    for k in grads:
        np.testing.assert_array_equal(np.asarray(out[k]), np.asarray(grads[k]))


@pytest.mark.parametrize("variant", ["flat_vectors_apart", "flat_vectors_held"])
def test_vector_variants_keep_the_mean_and_keep_vectors_out_of_the_buckets(variant):
    """Across 2 devices each variant's mean is numpy's (one fp32 sum of two values, halved:
    exact up to one rounding, rtol 2**-23); `apart` sums the vectors in a psum of their own and
    concatenates only kernels, `held` passes them through one barrier before packing."""
    two = Mesh(np.array(jax.devices()[:2]).reshape(1, 2), ("node", "gpu"))
    rng = np.random.default_rng(1)
    shapes = {"a": (3, 5), "b": (7,), "c": (2, 2, 4), "d": (11,)}
    stacked = {k: rng.normal(size=(2, *s)).astype(np.float32) for k, s in shapes.items()}

    def per_device(g):
        g = jax.tree.map(lambda x: x[0], g)
        return allreduce.reduce_gradients(
            g, strategy="flat", bucket_bytes=1000, wire_dtype="float32", hybrid_crossover_bytes=0
        )

    with pack_fusion._variant_patch(variant):
        reduce = jax.jit(jax.shard_map(
            per_device, mesh=two, in_specs=P(("node", "gpu")), out_specs=P()
        ))
        jaxpr = str(jax.make_jaxpr(reduce)(stacked))
        out = reduce(stacked)
    for k, x in stacked.items():
        want = x.astype(np.float64).mean(axis=0)
        np.testing.assert_allclose(np.asarray(out[k]), want, rtol=2**-23, atol=0)
    concatenated = [line for line in jaxpr.splitlines() if "concatenate" in line]
    assert len(concatenated) == 1, jaxpr
    # apart: the bucket is [c, a] (31 values); held: all four (49).
    assert ("f32[31]" in concatenated[0]) == (variant == "flat_vectors_apart"), concatenated
    assert jaxpr.count("optimization_barrier") == (variant == "flat_vectors_held"), jaxpr
