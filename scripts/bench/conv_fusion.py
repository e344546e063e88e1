r"""Can XLA compute a convolution's BatchNorm statistics inside the convolution's cuDNN kernel?

XLA's GPU compiler has an experimental pass (`xla_gpu_experimental_enable_conv_fusion`, off by
default) that compiles a convolution with the operations around it into one cuDNN graph (a
`__cudnn$fusion`) instead of its own `__cudnn$conv` call. This compiles, for one of ResNet-50's
3x3 convolutions (NHWC, bf16), each function below with and without that option and records what
the optimized HLO holds (cuDNN fusions, cuDNN conv calls, XLA's own reduce and loop fusions),
the median time of a jitted call, and whether both compiles give the same outputs:

  * `conv_stats`: the output and its per-channel sum and sum of squares in fp32, what a
    training BatchNorm after the convolution needs (the fusion that would save a read of y);
  * `conv_relu`: the output through a ReLU (a pointwise epilogue: shows the pass is active).

  python -m scripts.bench.conv_fusion --batch=256 --out=/tmp/conv_fusion.json
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from scripts.bench import harness

OPTION = "xla_gpu_experimental_enable_conv_fusion"


def conv(x: jax.Array, w: jax.Array) -> jax.Array:
    """A stride-1 SAME convolution, NHWC input, HWIO kernel."""
    return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"))


def conv_stats(x: jax.Array, w: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """y = conv(x, w), and per channel sum(y) and sum(y^2) in fp32."""
    y = conv(x, w)
    yf = y.astype(jnp.float32)
    return y, jnp.sum(yf, axis=(0, 1, 2)), jnp.sum(yf * yf, axis=(0, 1, 2))


def conv_relu(x: jax.Array, w: jax.Array) -> jax.Array:
    return jnp.maximum(conv(x, w), 0)


FUNCTIONS = {"conv_stats": conv_stats, "conv_relu": conv_relu}


def hlo_counts(text: str) -> dict[str, int]:
    """What an optimized HLO module holds: cuDNN graph fusions, cuDNN conv calls, XLA fusions."""
    return {
        "cudnn_fusions": len(re.findall(r"\"kind\":\"__cudnn\$fusion\"", text)),
        "cudnn_fusion_mentions": text.count("__cudnn$fusion"),
        "cudnn_conv_calls": len(re.findall(r"custom_call_target=\"__cudnn\$conv", text)),
        "xla_input_fusions": len(re.findall(r"kind=kInput", text)),
        "xla_loop_fusions": len(re.findall(r"kind=kLoop", text)),
    }


def measure(batch: int, size: int, channels: int, repeats: int) -> list[dict[str, Any]]:
    """One row per function and option: the HLO's counts, the median ms a call (`repeats`
    samples of calls), the outputs' match."""
    kx, kw = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, (batch, size, size, channels), jnp.bfloat16)
    w = (0.05 * jax.random.normal(kw, (3, 3, channels, channels))).astype(jnp.bfloat16)
    rows = []
    for name, fn in FUNCTIONS.items():
        lowered = jax.jit(lambda operands, fn=fn: fn(*operands)).lower((x, w))
        outputs = {}
        for fused in (False, True):
            row = {"function": name, "conv_fusion": fused, "shape": list(x.shape)}
            try:
                compiled = lowered.compile({OPTION: True} if fused else None)
                outputs[fused] = jax.tree.map(
                    lambda a: jax.device_get(a).astype("float64"), compiled((x, w)))
                timed = harness.time_compiled(compiled, (x, w), repeats, min_sample_s=0.02)
                row.update(hlo_counts(compiled.as_text()), ms=timed["time_s"] * 1e3)
            except Exception as e:  # noqa: BLE001 - an option this XLA lacks, a graph cuDNN refuses
                row["error"] = harness.error_text(e, 300)
            rows.append(row)
        if len(outputs) == 2:
            # bf16 y: two convolution algorithms may round y differently by one bf16 ulp.
            diffs = jax.tree.map(lambda a, b: float(abs(a - b).max() / (abs(b).max() + 1e-30)),
                                 outputs[False], outputs[True])
            rows[-1]["max_relative_difference"] = max(jax.tree.leaves(diffs))
    return rows


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--size", type=int, default=56)
    parser.add_argument("--channels", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", default="conv_fusion.json")
    args = parser.parse_args(argv)
    record = {
        "environment": harness.environment(),
        "args": vars(args),
        "results": measure(args.batch, args.size, args.channels, args.repeats),
    }
    harness.write_json(args.out, record)
    for row in record["results"]:
        print(row)
    return record


if __name__ == "__main__":
    main()
