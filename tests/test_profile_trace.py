"""The trace reader and the schedule reader of the profiling scripts, on hand-made inputs."""

import dataclasses
import gzip
import json
import pathlib

import numpy as np
import pytest

from scripts.bench import profile_trace
from scripts.bench.profile_step import collective_schedule, write_hlo


def _events():
    meta = [
        {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/host:CPU"}},
        {"ph": "M", "pid": 7, "name": "process_name", "args": {"name": "/device:GPU:0"}},
        {"ph": "M", "pid": 7, "tid": 1, "name": "thread_name", "args": {"name": "Stream #1(C)"}},
        {"ph": "M", "pid": 7, "tid": 2, "name": "thread_name", "args": {"name": "Stream #2(N)"}},
        {"ph": "M", "pid": 7, "tid": 3, "name": "thread_name", "args": {"name": "XLA Ops"}},
    ]

    def x(tid, name, ts, dur, pid=7):
        return {"ph": "X", "pid": pid, "tid": tid, "name": name, "ts": ts, "dur": dur}

    # Compute on stream 1: a conv 0-10, a fusion 12-20, a concatenate 20-22; NCCL on stream 2
    # 8-14 (overlaps the conv for 2 us and the fusion for 2 us, alone 10-12) and 30-35 (alone).
    return meta + [
        x(1, "sm90_xmma_fprop_implicit_gemm", 0, 10),
        x(1, "loop_add_fusion", 12, 8),
        x(1, "loop_concatenate_fusion", 20, 2),
        x(2, "ncclDevKernel_AllReduce_Sum_bf16", 8, 6),
        x(2, "ncclDevKernel_AllReduce_Sum_bf16", 30, 5),
        x(3, "fusion.1", 0, 10),  # not a stream: ignored
        x(1, "host thing", 0, 99, pid=1),  # not a GPU: ignored
    ]


def test_device_kernels_reads_gpu_streams_only_and_names_kinds():
    kernels = profile_trace.device_kernels(_events())
    assert list(kernels) == ["/device:GPU:0"]
    kinds = [(k.kind, k.start_us) for k in kernels["/device:GPU:0"]]
    assert kinds == [
        ("conv/gemm", 0.0),
        ("collective", 8.0),
        ("fusion", 12.0),
        ("concat/slice", 20.0),
        ("collective", 30.0),
    ]


def test_summary_splits_time_by_kind_and_overlap():
    [kernels] = profile_trace.device_kernels(_events()).values()
    s = profile_trace.summarize(kernels, steps=2)
    # Span 0-35 = 35 us; covered: 0-22 and 30-35 = 27 us; idle 8 us. Collectives 6 + 5 = 11 us,
    # of which 8-10 and 12-14 run beside compute (4 us). All per step (2 steps).
    assert s["span_us"] == 17.5 and s["idle_us"] == 4
    assert s["compute_us"] == 10  # 0-10 and 12-22 (the collectives' 30-35 is not compute)
    assert s["collective_us"] == 5.5 and s["collective_overlapped_us"] == 2
    assert s["collective_exposed_us"] == 3.5
    assert s["busy_conv/gemm_us"] == 5 and s["busy_fusion_us"] == 4
    assert s["busy_concat/slice_us"] == 1 and s["kernels_per_step"] == 2.5
    top = profile_trace.top_kernels(kernels, steps=2, n=1)
    assert top == [
        {"name": "ncclDevKernel_AllReduce_Sum_bf16", "us_per_step": 5.5, "count_per_step": 1.0}
    ]


def test_interval_helpers():
    assert profile_trace.union([(3, 4), (0, 2), (1, 3)]) == [(0, 4)]
    assert profile_trace.intersection([(0, 2), (5, 9)], [(1, 6)]) == [(1, 2), (5, 6)]
    assert profile_trace.length([(0, 2), (5, 9)]) == 6


def test_load_kernels_finds_the_newest_trace(tmp_path):
    run = tmp_path / "plugins" / "profile" / "2026_01_01"
    run.mkdir(parents=True)
    with gzip.open(run / "host.trace.json.gz", "wt") as f:
        json.dump({"traceEvents": _events()}, f)
    assert len(profile_trace.load_kernels(str(tmp_path))["/device:GPU:0"]) == 5
    events = profile_trace.load_events(str(tmp_path))
    [summary] = profile_trace.device_summaries(events, steps=2, n=1).values()
    assert summary["per_step"]["idle_us"] == 4  # as in the summary test above
    assert summary["gaps"]["longest"][0] == {
        "us": 8, "after": "loop_concatenate_fusion", "before": "ncclDevKernel_AllReduce_Sum_bf16"}
    assert summary["top"][0]["name"] == "ncclDevKernel_AllReduce_Sum_bf16"
    with pytest.raises(FileNotFoundError):
        profile_trace.load_kernels(str(tmp_path / "none"))


def test_collective_schedule_counts_compute_between_start_and_done():
    hlo = """HloModule m, is_scheduled=true

ENTRY %main (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  %all-reduce-start = f32[4]{0} all-reduce-start(f32[4]{0} %p), replica_groups={}
  %fusion.1 = f32[4]{0} fusion(f32[4]{0} %p), kind=kLoop
  %custom-call.2 = (f32[4]{0}, s8[0]{0}) custom-call(f32[4]{0} %fusion.1)
  %all-reduce-done = f32[4]{0} all-reduce-done(f32[4]{0} %all-reduce-start)
  %gte = f32[4]{0} get-tuple-element(%all-reduce-done), index=0
  %rs-start = ((f32[4]{0}), f32[2]{0}) reduce-scatter-start(f32[4]{0} %fusion.1)
  %rs-done = f32[2]{0} reduce-scatter-done(((f32[4]{0}), f32[2]{0}) %rs-start)
  ROOT %fusion.3 = f32[4]{0} fusion(f32[4]{0} %all-reduce-done), kind=kLoop
}
"""
    # The operand of get-tuple-element is not a second done; the reduce-scatter has nothing
    # scheduled between its start and done.
    assert collective_schedule(hlo) == [
        {"op": "all-reduce", "start_after_compute": 0, "compute_overlapped": 2},
        {"op": "reduce-scatter", "start_after_compute": 2, "compute_overlapped": 0},
    ]


# Kernel names as a GPU trace of an XLA train step shows them (CUDA 12, H100), and their kind.
KIND_CASES = [
    # XLA fusions are named after their ops; "convert" must not read as a convolution.
    ("loop_convert_fusion_3", "fusion"),
    ("input_convert_transpose_fusion", "fusion"),
    ("input_reduce_fusion", "fusion"),
    ("loop_multiply_fusion_12", "fusion"),
    ("wrapped_convert", "fusion"),
    ("loop_concatenate_fusion", "concat/slice"),
    ("loop_dynamic_update_slice_fusion_1", "concat/slice"),
    ("input_slice_fusion", "concat/slice"),
    # XLA's own Triton GEMMs are GEMMs.
    ("gemm_fusion_dot_4", "conv/gemm"),
    # Library convolutions and GEMMs.
    (
        "sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64",
        "conv/gemm",
    ),
    (
        "void cutlass__5x_cudnn::Kernel<cutlass_tensorop_bf16_s16816fprop_optimized>(Params)",
        "conv/gemm",
    ),
    ("nvjet_sm90_tst_256x128_64x4_2x1_v_bz_coopB_TNN", "conv/gemm"),
    (
        "void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float>(Params)",
        "conv/gemm",
    ),
    (
        "void nhwcAddPaddingKernel<__nv_bfloat16, __nv_bfloat16, float, true>(int, int, int)",
        "conv/gemm",
    ),
    # nvJPEG's colour conversion, beside the step on the GPU input path: no convolution.
    (
        "void nvjpeg::ycbcr_to_format_kernel_roi<(nvjpegChromaSubsampling_t)2, true, "
        "(nvjpegOutputFormat_t)5, nvjpeg::ConvertToFormat<unsigned char>>(Params)",
        "fusion",
    ),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "collective"),
    ("Memcpy DtoD (Device -> Device)", "copy"),
    ("Memset (Device)", "copy"),
]


@pytest.mark.parametrize("name,kind", KIND_CASES)
def test_kernel_kind(name, kind):
    assert profile_trace.kernel_kind(name) == kind


BREAKDOWN_CASES = [
    ("sm90_xmma_fprop_implicit_gemm_bf16bf16", "conv/gemm"),
    ("loop_convert_fusion_3", "elementwise"),
    ("loop_concatenate_fusion", "elementwise"),
    ("input_reduce_fusion", "bn/reduction"),
    ("input_reduce_select_fusion", "bn/reduction"),
    ("input_add_reduce_fusion", "bn/reduction"),
    ("input_multiply_reduce_fusion_2", "bn/reduction"),
    ("void cublasLt::splitKreduce_kernel<32, 16>", "conv/gemm"),  # a GEMM before "reduce"
    ("input_convert_transpose_fusion", "transpose/layout"),
    ("loop_transpose_fusion", "transpose/layout"),  # "transpose" before "loop_"
    ("input_scatter_fusion", "pooling"),
    ("loop_select_and_scatter_fusion", "pooling"),
    ("loop_reduce_window_fusion", "pooling"),  # pooling before "reduce"
    ("ncclDevKernel_ReduceScatter_Sum_f32", "collective"),  # not pooling, not a reduction
    ("Memcpy HtoD (Pinned -> Device)", "copy"),
    ("wrapped_convert", "other"),
    ("fusion_7", "other"),
]


@pytest.mark.parametrize("name,category", BREAKDOWN_CASES)
def test_breakdown_category_order(name, category):
    assert profile_trace.breakdown_category(name) == category


def test_fusion_breakdown_sums_time_and_counts_per_step():
    def k(name, start, dur):
        return profile_trace.Kernel(
            name, start, start + dur, "Stream #1", profile_trace.kernel_kind(name)
        )

    # Two steps: conv 10 + 6, BN reductions 3 + 1 + 2, casts 0.5 + 1.5, a transpose 4, max-pool
    # forward 2 and backward 6, an all-reduce 8, a copy 1, an unfused op 0.25.
    kernels = [
        k("sm90_xmma_fprop_implicit_gemm_bf16bf16", 0, 10),
        k("nvjet_sm90_tst_256x128", 10, 6),
        k("input_reduce_fusion", 16, 3),
        k("input_add_reduce_fusion_1", 19, 1),
        k("input_reduce_select_fusion", 20, 2),
        k("loop_convert_fusion_3", 22, 0.5),
        k("loop_convert_fusion_4", 22.5, 1.5),
        k("input_convert_transpose_fusion", 24, 4),
        k("loop_reduce_window_fusion", 28, 2),
        k("input_scatter_fusion", 30, 6),
        k("ncclDevKernel_AllReduce_Sum_f32", 30, 8),
        k("Memcpy DtoD (Device -> Device)", 38, 1),
        k("wrapped_convert", 39, 0.25),
    ]
    out = profile_trace.fusion_breakdown(kernels, steps=2)
    assert list(out) == list(profile_trace.BREAKDOWN_CATEGORIES)
    assert out == {
        "conv/gemm": {"us_per_step": 8.0, "count_per_step": 1.0},
        "bn/reduction": {"us_per_step": 3.0, "count_per_step": 1.5},
        "elementwise": {"us_per_step": 1.0, "count_per_step": 1.0},
        "transpose/layout": {"us_per_step": 2.0, "count_per_step": 0.5},
        "pooling": {"us_per_step": 4.0, "count_per_step": 1.0},
        "copy": {"us_per_step": 0.5, "count_per_step": 0.5},
        "collective": {"us_per_step": 4.0, "count_per_step": 0.5},
        "other": {"us_per_step": 0.125, "count_per_step": 0.5},
    }
    total = sum(k.end_us - k.start_us for k in kernels) / 2
    assert sum(v["us_per_step"] for v in out.values()) == total
    assert sum(v["count_per_step"] for v in out.values()) == len(kernels) / 2


def test_write_hlo_creates_its_folder_and_names_the_file_by_case(tmp_path):
    case = {"model": "resnet50", "mesh": "1x1", "strategy": "xla", "per_device_batch": 64}
    path = write_hlo(str(tmp_path / "new" / "hlo"), case, "HloModule m")
    assert path == str(tmp_path / "new" / "hlo" / "resnet50_1x1_xla_64.hlo.gz")
    with gzip.open(path, "rt") as f:
        assert f.read() == "HloModule m"


def test_idle_gaps_classes_each_gap_and_names_its_neighbours():
    def k(name, start, end):
        return profile_trace.Kernel(name, start, end, "Stream #1", "fusion")

    # Busy 0-20 (two overlapping kernels), 25-30, 1030-1040, 1040.5-1050: gaps of 5, 1000, 0.5.
    kernels = [k("a", 0, 10), k("b", 5, 20), k("c", 25, 30), k("d", 1030, 1040),
               k("e", 1040.5, 1050)]
    gaps = profile_trace.idle_gaps(kernels, steps=2, n=2)
    assert gaps["classes"] == {
        "lt_10us": {"count_per_step": 1.0, "us_per_step": 2.75},
        "10_100us": {"count_per_step": 0.0, "us_per_step": 0.0},
        "100_1000us": {"count_per_step": 0.0, "us_per_step": 0.0},
        "ge_1000us": {"count_per_step": 0.5, "us_per_step": 500.0},
    }
    assert gaps["longest"] == [{"us": 1000, "after": "c", "before": "d"},
                               {"us": 5, "after": "b", "before": "c"}]


def test_jit_calls_counts_each_call_once_on_host_threads_only(tmp_path):
    def x(pid, tid, name, ts, dur):
        return {"ph": "X", "pid": pid, "tid": tid, "name": name, "ts": ts, "dur": dur}

    events = [
        {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/host:CPU"}},
        {"ph": "M", "pid": 7, "name": "process_name", "args": {"name": "/device:GPU:0"}},
        # Two calls of `step` on thread 1, each recorded twice (one event inside the other).
        x(1, 1, "PjitFunction(step)", 0, 10), x(1, 1, "PjitFunction(step)", 1, 8),
        x(1, 1, "PjitFunction(step)", 20, 5), x(1, 1, "PjitFunction(step)", 20, 6),
        x(1, 2, "PjitFunction(crop)", 3, 2),  # another thread, overlapping in time: counted
        x(1, 1, "PjRtExecute", 0, 9),  # not a jitted call
        x(7, 1, "PjitFunction(step)", 0, 50),  # a device's event: ignored
    ]
    path = tmp_path / "t.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    got = profile_trace.jit_calls(profile_trace.load_events(str(path)), steps=2)
    assert got == {
        "PjitFunction(crop)": {"calls_per_step": 0.5, "us_per_step": 1.0},
        "PjitFunction(step)": {"calls_per_step": 1.0, "us_per_step": 8.0},
    }


def test_profile_step_builds_every_case_with_the_model_options(tmp_path, monkeypatch):
    """`--model_options` reaches the config of each case (a case that fails is recorded with
    its error, the next still runs)."""
    from scripts.bench import profile_step, trainer_step

    seen = []

    def make_config(*args, **kwargs):
        seen.append(kwargs["model_options"])
        raise RuntimeError("stop after the config")

    monkeypatch.setattr(trainer_step, "make_config", make_config)
    rows = profile_step.main([
        "--cases=resnet50:1x1:xla:64,resnet50:1x1:xla:256", "--model_options=space_to_depth_stem,",
        f"--out={tmp_path / 'p.json'}",
    ])
    assert seen == [["space_to_depth_stem"], ["space_to_depth_stem"]]
    assert all("stop after the config" in r["error"] for r in rows)
    profile_step.main(["--cases=resnet50:1x1:xla:64", f"--out={tmp_path / 'q.json'}"])
    assert seen[-1] == []


def _stream_kernels(rng: np.random.Generator, gaps: np.ndarray, stream: str) -> list:
    """Kernels one after another on `stream`, the boundaries between them `gaps`."""
    durations = rng.uniform(1.0, 30.0, len(gaps) + 1)
    starts = np.concatenate([[0.0], np.cumsum(durations[:-1] + gaps)])
    return [profile_trace.Kernel(f"k{i % 7}", s, s + d, stream, "fusion")
            for i, (s, d) in enumerate(zip(starts, durations, strict=True))]


def test_stream_boundaries_against_numpy():
    rng = np.random.default_rng(0)
    gaps = np.concatenate([rng.normal(0.2, 0.3, 400), [250.0, 12.0, 9.5]])
    rng.shuffle(gaps)
    main = _stream_kernels(rng, gaps, "Stream #14(Compute)")
    # A busy other stream with fewer kernels, interleaved in time, is not the one measured.
    other = _stream_kernels(rng, rng.uniform(-5, 5, 99), "Stream #97(Compute)")
    got = profile_trace.stream_boundaries(other + main, steps=4)
    short = gaps[gaps < profile_trace.BOUNDARY_BELOW_US]
    assert got["stream"] == "Stream #14(Compute)"
    assert got["count_per_step"] == len(short) / 4 == 401 / 4
    assert got["negative_per_step"] == np.sum(short < 0) / 4
    assert got["sum_us_per_step"] == pytest.approx(short.sum() / 4, abs=1e-9)
    for q in (10, 50, 90):
        want = np.percentile(short, q, method="lower")
        # Starts and ends are sums of floats: each boundary is exact to a few ulps of the times.
        assert got[f"p{q}_us"] == pytest.approx(want, abs=1e-9)
    # Split by whether the other stream ran when the previous kernel ended.
    ends = np.array([k.end_us for k in main[:-1]])
    spans = np.array([(k.start_us, k.end_us) for k in other])
    busy = ((spans[:, :1] <= ends) & (ends <= spans[:, 1:])).any(axis=0)
    keep = gaps < profile_trace.BOUNDARY_BELOW_US
    assert 0 < busy[keep].sum() < keep.sum()  # both kinds occur
    assert got["beside_other_per_step"] == busy[keep].sum() / 4
    assert got["p50_us_beside_other"] == pytest.approx(
        np.percentile(gaps[keep & busy], 50, method="lower"), abs=1e-9)
    assert got["p50_us_alone"] == pytest.approx(
        np.percentile(gaps[keep & ~busy], 50, method="lower"), abs=1e-9)


def test_stream_boundaries_of_a_stream_without_short_ones():
    kernels = [profile_trace.Kernel("a", 0.0, 1.0, "s", "fusion"),
               profile_trace.Kernel("b", 50.0, 51.0, "s", "fusion")]
    got = profile_trace.stream_boundaries(kernels, steps=1)
    assert (got["count_per_step"], got["p50_us"]) == (0.0, None)


def test_kernel_dump_round_trip():
    rng = np.random.default_rng(1)
    kernels = _stream_kernels(rng, rng.uniform(0, 2, 20), "Stream #14")
    kernels.append(profile_trace.Kernel("MemcpyH2D", 3.0, 4.5, "Stream #15", "copy"))
    back = profile_trace.undump_kernels(json.loads(json.dumps(profile_trace.dump_kernels(kernels))))
    assert [(k.name, k.stream, k.kind) for k in back] == [
        (k.name, k.stream, k.kind) for k in sorted(kernels, key=lambda k: k.start_us)]
    # Times are kept to the trace's resolution (ns), 3 decimals of µs.
    want = sorted((k.start_us, k.end_us) for k in kernels)
    assert np.allclose([(k.start_us, k.end_us) for k in back], want, atol=2e-3, rtol=0)


def test_after_first_step_leaves_out_the_first_steps_wait_and_clips_at_the_second():
    """Three steps of two compute kernels each (stream C): the first step's all-reduce waits
    10-30 with nothing beside it (a peer that started late); steps 2 and 3 leave 2 µs of
    their all-reduce (stream N) exposed each. A copy (stream H) straddles step 2's start."""
    k = profile_trace.Kernel
    kernels = [k("f", a, b, "C", "fusion") for a, b in
               ((0, 10), (30, 40), (40, 50), (52, 62), (62, 72), (74, 84))]
    kernels += [k("nccl", a, b, "N", "collective") for a, b in ((10, 30), (45, 52), (67, 74))]
    kernels.append(k("memcpy", 38, 44, "H", "copy"))
    whole = profile_trace.summarize(kernels, steps=3)
    assert whole["collective_exposed_us"] == pytest.approx((20 + 2 + 2) / 3)
    later = profile_trace.after_first_step(kernels, steps=3)
    assert min(x.start_us for x in later) == 40  # kernel 2 of C (of 6) opens step 2
    s = profile_trace.summarize(later, steps=2)
    # Steps 2-3: span 40-84; compute 40-50, 52-62, 62-72, 74-84 (the copy's 40-44 within);
    # collectives 45-52 and 67-74, of which 50-52 and 72-74 alone.
    assert s["span_us"] == 22 and s["idle_us"] == 0 and s["compute_us"] == 20
    assert s["collective_exposed_us"] == 2 and s["collective_overlapped_us"] == 5
    assert s["busy_copy_us"] == 2  # 40-44 of the copy, clipped at step 2's start
    assert profile_trace.after_first_step(kernels, steps=1) is None
    assert profile_trace.after_first_step(kernels, steps=4) is None  # 6 kernels of C: uneven
    assert profile_trace.after_first_step([], steps=3) is None
    # As many kernels a step, but step 2 opened by another kernel: the steps are not alike.
    renamed = [dataclasses.replace(x, name="g") if x.start_us == 40 else x for x in kernels]
    assert profile_trace.after_first_step(renamed, steps=3) is None


def test_after_first_step_splits_a_kept_trace_of_ten_steps_at_a_step():
    """The trainer's 64-image step traced for 10 steps on one H200 (a kept raw trace): split at
    the step, the later 9 hold exactly 9 steps' kernels of every stream; a wrong step count
    does not split."""
    kept = pathlib.Path(__file__).resolve().parents[1] / "docs" / "benchmarks"
    events = profile_trace.load_events(
        str(kept / "gpu_decode_trace64_synthetic_1xH200.trace.json.gz"))
    [kernels] = profile_trace.device_kernels(events).values()
    later = profile_trace.after_first_step(kernels, steps=10)
    assert len(later) * 10 == len(kernels) * 9
    assert profile_trace.summarize(later, 9)["kernels_per_step"] == pytest.approx(
        profile_trace.summarize(kernels, 10)["kernels_per_step"])
    for wrong in (3, 4, 7):
        assert profile_trace.after_first_step(kernels, steps=wrong) is None
