"""`scripts.bench.conv_fusion`: the functions it compiles compute what they name (float64 numpy
reference), and its record has a row per function and option with the outputs compared."""

import jax
import jax.numpy as jnp
import numpy as np

from scripts.bench import conv_fusion
from tests import conv_checks


def test_conv_stats_is_the_convolution_and_its_channel_sums():
    kx, kw = jax.random.split(jax.random.key(1))
    x = jax.random.normal(kx, (2, 6, 6, 8), jnp.bfloat16)
    w = (0.3 * jax.random.normal(kw, (3, 3, 8, 8))).astype(jnp.bfloat16)
    y, total, squares = jax.jit(conv_fusion.conv_stats)(x, w)
    # conv_fusion's kernels are (h, w, in, out): as (out, h, w, in) for the reference.
    kernel = np.asarray(w, np.float64).transpose(3, 0, 1, 2)
    want, terms = conv_checks.conv64(np.asarray(x, np.float64), kernel)
    conv_checks.assert_bf16_conv(y, want, terms, taps=72)
    conv_checks.assert_channel_sums(y, total, squares)
    relu = jax.jit(conv_fusion.conv_relu)(x, w)
    np.testing.assert_array_equal(np.asarray(relu), np.maximum(np.asarray(y), 0))


def test_record_has_each_function_with_and_without_the_option(tmp_path):
    out = tmp_path / "conv_fusion.json"
    record = conv_fusion.main(["--batch=2", "--size=6", "--channels=4", "--repeats=2",
                               f"--out={out}"])
    rows = {(r["function"], r["conv_fusion"]): r for r in record["results"]}
    assert set(rows) == {(f, o) for f in conv_fusion.FUNCTIONS for o in (False, True)}
    for name in conv_fusion.FUNCTIONS:
        # On the CPU the GPU option changes nothing: both compiles give the same outputs.
        assert rows[name, True]["max_relative_difference"] == 0.0
        assert rows[name, False]["cudnn_fusions"] == rows[name, True]["cudnn_fusions"] == 0
        assert all(rows[name, o]["ms"] > 0 for o in (False, True))
    assert out.exists()
