"""The trace reader and the schedule reader of the profiling scripts, on hand-made inputs."""

import gzip
import json

import pytest

from jia_jax import profile_trace
from scripts.profile_step import collective_schedule


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
