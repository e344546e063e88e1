"""`scripts.bench.kernel_bandwidth`: fusion bytes read off an HLO text, joined with a trace's
kernels into GB/s and excess time, on a hand-written module whose byte counts are known."""

import pytest

from scripts.bench import kernel_bandwidth

# Two fusions of the entry computation; fusion.1 reads a bf16[4,8] (64 B) and an f32[8] (32 B)
# and writes a tuple of f32[8] (32 B) and bf16[4,8] (64 B); the nested computation's
# instructions are not the entry's and must not count.
HLO = """HloModule m

%fused_reduce (p0: bf16[4,8]) -> f32[8] {
  %p0 = bf16[4,8]{1,0} parameter(0)
  %inner = f32[4,8]{1,0} convert(%p0)
}

ENTRY %main (a: bf16[4,8], b: f32[8]) -> f32[8] {
  %a = bf16[4,8]{1,0} parameter(0)
  %b = f32[8]{0} parameter(1)
  %input_reduce_fusion.1 = (f32[8]{0}, bf16[4,8]{1,0}) fusion(%a, %b), metadata={op_name="bn/sum"}
  %loop_add_fusion = f32[8]{0} fusion(%b), kind=kLoop, calls=%y
  %cudnn-conv = (bf16[4,8]{1,0}, u8[0]{0}) custom-call(%a), custom_call_target="__cudnn$convForward"
  ROOT %t = f32[8]{0} add(%loop_add_fusion, %b)
}
"""


def test_fusion_bytes_counts_operands_and_results_of_entry_fusions_only():
    fusions = kernel_bandwidth.fusion_bytes(HLO)
    assert set(fusions) == {"input_reduce_fusion_1", "loop_add_fusion"}
    assert fusions["input_reduce_fusion_1"] == {
        "read": 4 * 8 * 2 + 8 * 4,
        "written": 8 * 4 + 4 * 8 * 2,
        "op": "bn/sum",
    }
    assert fusions["loop_add_fusion"]["read"] == fusions["loop_add_fusion"]["written"] == 32


def test_kernel_rows_per_step_rates_and_excess():
    fusions = kernel_bandwidth.fusion_bytes(HLO)
    # Two steps: the reduce runs twice a step for 1 µs and 3 µs; the add once for 0.032 µs;
    # the convolution has no fusion and is left out.
    kernels = [
        ("input_reduce_fusion_1", 0.0, 1.0, "s", "fusion"),
        ("input_reduce_fusion_1", 5.0, 8.0, "s", "fusion"),
        ("input_reduce_fusion_1", 10.0, 11.0, "s", "fusion"),
        ("input_reduce_fusion_1", 15.0, 18.0, "s", "fusion"),
        ("loop_add_fusion", 20.0, 20.032, "s", "fusion"),
        ("loop_add_fusion", 30.0, 30.032, "s", "fusion"),
        ("sm90_xmma_fprop", 40.0, 90.0, "s", "conv/gemm"),
    ]
    rows = kernel_bandwidth.kernel_rows(kernels, fusions, steps=2, gb_s=1.0)
    assert [r["kernel"] for r in rows] == ["input_reduce_fusion_1", "loop_add_fusion"]
    reduce_row, add_row = rows
    assert reduce_row["launches_per_step"] == 2 and reduce_row["us_per_step"] == 4.0
    moved = 2 * (96 + 96)  # bytes a step: two launches of 96 read + 96 written
    assert reduce_row["mb_per_step"] == pytest.approx(moved / 1e6)
    assert reduce_row["gb_per_s"] == pytest.approx(moved / 4.0 / 1e3)
    # At 1 GB/s a byte takes 1 ns: 384 bytes need 0.384 µs of the 4 µs.
    assert reduce_row["excess_us"] == pytest.approx(4.0 - 0.384)
    assert add_row["gb_per_s"] == pytest.approx(64 / 0.032 / 1e3)
    assert add_row["excess_us"] == pytest.approx(0.032 - 0.064)
