r"""Can cuDNN compute BatchNorm's statistics in a convolution's epilogue, inside a jitted step?

Training BatchNorm after a convolution reads the convolution's output y once more for its
per-channel sum and sum of squares. cuDNN's graph API can compute both in the convolution's own
kernel (a `genstats` node after `conv_fprop`, a runtime-fusion engine), which XLA does not offer
(docs/benchmarks.md, "Can XLA compute BatchNorm's statistics in the convolution's kernel?").
This times, for each of ResNet-50 v1.5's convolutions after the stem (NHWC, bf16, fp32
accumulation, kernels stored (out, h, w, in) as the models store them), as one jitted call each:

  * `xla_conv`: XLA's convolution alone;
  * `xla_conv_stats`: XLA's convolution, then the fp32 sum and sum of squares of its output;
  * `cudnn_conv`: a cuDNN graph of the convolution alone, run on XLA's stream from
    `jax.experimental.buffer_callback` (XLA allocates its output and workspace);
  * `cudnn_genstats`: the graph with `genstats` on the convolution's output;
  * `cudnn_genstats_shifted`: the same on the output less a per-channel shift K (the sums of
    y - K, what an accurate variance needs; `jia_jax.models.batch_norm_ops.moments`).

and checks the cuDNN outputs against XLA's convolution and float64 sums of y. The per-step
figure weights each shape by how many convolutions of it one forward pass has.

  python -m scripts.bench.cudnn_genstats --batches=256,64 --out=/tmp/cudnn_genstats.json
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from scripts.bench import harness

# ResNet-50 v1.5 at 224 pixels after the stem: (input size, in channels, out channels, kernel,
# stride, convolutions of this shape in one forward pass); tests check it against the model.
RESNET50_CONVS = (
    (56, 64, 64, 1, 1, 1),
    (56, 64, 64, 3, 1, 3),
    (56, 64, 256, 1, 1, 4),
    (56, 256, 64, 1, 1, 2),
    (56, 256, 128, 1, 1, 1),
    (56, 128, 128, 3, 2, 1),
    (56, 256, 512, 1, 2, 1),
    (28, 128, 512, 1, 1, 4),
    (28, 512, 128, 1, 1, 3),
    (28, 128, 128, 3, 1, 3),
    (28, 512, 256, 1, 1, 1),
    (28, 256, 256, 3, 2, 1),
    (28, 512, 1024, 1, 2, 1),
    (14, 256, 1024, 1, 1, 6),
    (14, 1024, 256, 1, 1, 5),
    (14, 256, 256, 3, 1, 5),
    (14, 1024, 512, 1, 1, 1),
    (14, 512, 512, 3, 2, 1),
    (14, 1024, 2048, 1, 2, 1),
    (7, 512, 2048, 1, 1, 3),
    (7, 2048, 512, 1, 1, 2),
    (7, 512, 512, 3, 1, 2),
)

VARIANTS = ("xla_conv", "xla_conv_stats", "cudnn_conv", "cudnn_genstats", "cudnn_genstats_shifted")


def out_size(size: int, kernel: int, stride: int) -> int:
    """Output height (= width) of a convolution padded k//2 on each side, as the models pad."""
    pad = kernel // 2
    return (size + 2 * pad - kernel) // stride + 1


def xla_conv(x: jax.Array, w: jax.Array, stride: int) -> jax.Array:
    """NHWC input, (out, h, w, in) kernel, symmetric k//2 padding: the models' convolution."""
    pad = w.shape[1] // 2
    return jax.lax.conv_general_dilated(
        x, w, (stride, stride), ((pad, pad), (pad, pad)),
        dimension_numbers=("NHWC", "OHWI", "NHWC"))


def xla_conv_stats(x: jax.Array, w: jax.Array, stride: int) -> tuple[jax.Array, ...]:
    """y, and per channel sum(y) and sum(y^2) in fp32."""
    y = xla_conv(x, w, stride)
    yf = y.astype(jnp.float32)
    return y, jnp.sum(yf, axis=(0, 1, 2)), jnp.sum(yf * yf, axis=(0, 1, 2))


def _nhwc(n: int, c: int, h: int, w: int) -> dict[str, list[int]]:
    """cuDNN's dims (always n, c, h, w) and strides of an NHWC tensor."""
    return {"dim": [n, c, h, w], "stride": [h * w * c, 1, w * c, c]}


def _pointer(buffer: Any) -> int:
    return buffer.__cuda_array_interface__["data"][0]


class CudnnConv:
    """A cuDNN graph of one convolution, optionally with `genstats` (of y, or of y - K)."""

    def __init__(self, batch: int, size: int, cin: int, cout: int, kernel: int, stride: int,
                 stats: bool, shifted: bool, max_plans: int = 8):
        import cudnn  # noqa: PLC0415 - GPU hosts only

        self.cudnn = cudnn
        self.handle = cudnn.create_handle()
        bf16, f32 = cudnn.data_type.BFLOAT16, cudnn.data_type.FLOAT
        g = cudnn.pygraph(io_data_type=bf16, intermediate_data_type=f32, compute_data_type=f32,
                          handle=self.handle)
        ho, pad = out_size(size, kernel, stride), kernel // 2
        self.y_shape = (batch, ho, ho, cout)
        self.x = g.tensor(name="X", data_type=bf16, **_nhwc(batch, cin, size, size))
        self.w = g.tensor(name="W", data_type=bf16, **_nhwc(cout, cin, kernel, kernel))
        self.y = g.conv_fprop(image=self.x, weight=self.w, padding=[pad, pad],
                              stride=[stride, stride], dilation=[1, 1], compute_data_type=f32,
                              name="conv")
        layout = _nhwc(batch, cout, ho, ho)
        self.y.set_output(True).set_data_type(bf16).set_dim(layout["dim"])
        self.y.set_stride(layout["stride"])
        self.k = self.sums = None
        if stats:
            source = self.y
            if shifted:
                self.k = g.tensor(name="K", data_type=f32, **_nhwc(1, cout, 1, 1))
                source = g.sub(a=self.y, b=self.k, compute_data_type=f32, name="shift")
            self.sums = g.genstats(input=source, compute_data_type=f32, name="stats")
            for t in self.sums:
                t.set_output(True).set_data_type(f32)
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        g.check_support()
        self.graph, self.plans = g, self._build(g, max_plans)
        self.workspace = max(1, *(int(g.get_workspace_size_plan_at_index(i)) for i in self.plans))
        # Read by each call, so a plan or repeat count changes without recompiling.
        self.index, self.repeat = next(iter(self.plans)), 1

    @staticmethod
    def _build(g: Any, max_plans: int) -> dict[int, str]:
        """The first `max_plans` of cuDNN's ranked plans that build, by index, with their names."""
        built = {}
        for i in range(min(max_plans, g.get_execution_plan_count())):
            try:
                g.build_plan_at_index(i)
            except Exception:  # noqa: BLE001,S112 - a plan this GPU cannot run; try the next
                continue
            built[i] = g.get_plan_name_at_index(i)
        if not built:
            raise RuntimeError("no cuDNN plan for this graph built")
        return built

    def __call__(self, x: jax.Array, w: jax.Array, k: jax.Array | None = None) -> tuple:
        from jax.experimental.buffer_callback import buffer_callback  # noqa: PLC0415

        outs = [jax.ShapeDtypeStruct(self.y_shape, jnp.bfloat16)]
        if self.sums is not None:
            outs += [jax.ShapeDtypeStruct((self.y_shape[-1],), jnp.float32)] * 2
        outs.append(jax.ShapeDtypeStruct((self.workspace,), jnp.uint8))

        def run(ctx, out, *args):
            self.cudnn.set_stream(self.handle, ctx.stream)
            pack = {self.x: _pointer(args[0]), self.w: _pointer(args[1]),
                    self.y: _pointer(out[0])}
            if self.sums is not None:
                pack[self.sums[0]], pack[self.sums[1]] = _pointer(out[1]), _pointer(out[2])
            if self.k is not None:
                pack[self.k] = _pointer(args[2])
            for _ in range(self.repeat):
                self.graph.execute_plan_at_index(pack, _pointer(out[-1]), self.index,
                                                 handle=self.handle)

        operands = (x, w) if k is None else (x, w, k)
        return tuple(buffer_callback(run, outs)(*operands)[:-1])


def time_plans(conv: CudnnConv, operands: tuple, repeat: int = 10) -> dict[str, Any]:
    """µs of one run of each built plan (`repeat` runs a call, so the host's time per call does
    not hide the GPU's), and the fastest."""
    fn = jax.jit(lambda ops: conv(*ops))
    conv.repeat, times = repeat, {}
    for index in conv.plans:
        conv.index = index
        t = harness.time_calls(fn, operands, repeats=3, min_sample_s=0.02)["time_s"]
        times[index] = t * 1e6 / repeat
    best = min(times, key=times.get)
    return {"us": times[best], "plan": conv.plans[best], "plan_index": best,
            "plans_us": {f"{i}:{conv.plans[i]}": t for i, t in times.items()}}


def check(name: str, outs: tuple, y_xla: jax.Array, shift: np.ndarray) -> dict[str, float]:
    """How far a cuDNN variant's outputs are from XLA's y and from float64 sums of its own y."""
    y = np.asarray(outs[0], np.float64)
    ref = np.asarray(y_xla, np.float64)
    row = {"y_max_abs_diff": float(np.max(np.abs(y - ref))),
           "y_max_abs": float(np.max(np.abs(ref)))}
    if len(outs) == 3:
        centred = y - (shift if name.endswith("shifted") else 0.0)
        flat = centred.reshape(-1, y.shape[-1])
        s, q = flat.sum(0), (flat * flat).sum(0)
        row["sum_rel_err"] = float(np.max(np.abs(np.asarray(outs[1]) - s))
                                   / np.max(np.abs(flat).sum(0)))
        row["sq_sum_rel_err"] = float(np.max(np.abs(np.asarray(outs[2]) - q) / q))
    return row


def measure_shape(batch: int, shape: tuple[int, ...], variants: Sequence[str],
                  max_plans: int = 8) -> list[dict]:
    """Rows of µs a call (and accuracy, for cuDNN) for one convolution shape."""
    size, cin, cout, kernel, stride, count = shape
    kx, kw = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, (batch, size, size, cin), jnp.bfloat16)
    w = (jax.random.normal(kw, (cout, kernel, kernel, cin)) / (cin * kernel**2) ** 0.5)
    w = w.astype(jnp.bfloat16)
    y_xla = jax.jit(xla_conv, static_argnums=2)(x, w, stride)
    shift = np.asarray(y_xla[0, 0, 0], np.float32)
    k = jnp.asarray(shift)
    base = {"batch": batch, "size": size, "in_channels": cin, "out_channels": cout,
            "kernel": kernel, "stride": stride, "count": count}
    rows = []
    for name in variants:
        row = {**base, "variant": name}
        try:
            if name.startswith("xla"):
                f = {"xla_conv": xla_conv, "xla_conv_stats": xla_conv_stats}[name]
                fn = jax.jit(lambda ops, f=f: f(*ops, stride))
                t = harness.time_calls(fn, (x, w), repeats=5, min_sample_s=0.02)["time_s"]
                row["us"] = t * 1e6
            else:
                conv = CudnnConv(batch, size, cin, cout, kernel, stride,
                                 stats=name != "cudnn_conv", shifted=name.endswith("shifted"),
                                 max_plans=max_plans)
                row.update(time_plans(conv, (x, w, k) if conv.k is not None else (x, w)))
                conv.index, conv.repeat = row["plan_index"], 1
                fn = jax.jit(lambda ops, conv=conv: conv(*ops))
                row.update(check(name, fn((x, w, k) if conv.k is not None else (x, w)),
                                 y_xla, shift))
        except Exception as e:  # noqa: BLE001 - a graph this cuDNN or GPU refuses
            row["error"] = harness.error_text(e, 600)
        rows.append(row)
        print(row, flush=True)
    return rows


def per_step(rows: Sequence[dict]) -> list[dict[str, Any]]:
    """µs of one forward pass's convolutions (after the stem) per variant and batch: each shape's
    time times its count, over the shapes every variant of that batch timed."""
    out = []
    for batch in sorted({r["batch"] for r in rows}, reverse=True):
        mine = [r for r in rows if r["batch"] == batch]
        timed = {}
        for r in mine:
            timed.setdefault(r["variant"], {})[r["size"], r["in_channels"], r["out_channels"],
                                                r["kernel"], r["stride"]] = r
        common = set.intersection(*(set(v) for v in timed.values()))
        for variant, by_shape in timed.items():
            ok = [by_shape[s] for s in common if "us" in by_shape[s]]
            if len(ok) == len(common):
                out.append({"batch": batch, "variant": variant, "shapes": len(common),
                            "us": sum(r["us"] * r["count"] for r in ok)})
    return out


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="256,64")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--max_plans", type=int, default=8,
                        help="time this many of cuDNN's ranked plans per graph, keep the fastest")
    parser.add_argument("--out", default="cudnn_genstats.json")
    args = parser.parse_args(argv)
    doc: dict[str, Any] = {"environment": harness.environment(), "args": vars(args),
                           "results": []}
    for batch in (int(b) for b in args.batches.split(",")):
        for shape in RESNET50_CONVS:
            doc["results"] += measure_shape(batch, shape, args.variants.split(","),
                                            args.max_plans)
            doc["per_step"] = per_step(doc["results"])
            harness.write_json(args.out, doc)
    return doc


if __name__ == "__main__":
    main()
