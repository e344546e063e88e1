"""Tests for scripts/bench/host_trace.py: the host's time in jitted calls split by self time."""

import pathlib

import pytest

from scripts.bench import host_trace, profile_trace

KEPT = pathlib.Path(__file__).resolve().parents[1] / "docs" / "benchmarks"


def _x(pid, tid, name, ts, dur):
    return {"ph": "X", "pid": pid, "tid": tid, "name": name, "ts": ts, "dur": dur}


def test_self_times_split_each_call_by_what_is_nested_in_it():
    """By hand: a call of 100 µs holding A (60, itself holding B of 20) and C (10) leaves the
    call 30 of its own, A 40, B 20, C 10; numbered names group; events outside the calls, on
    other threads or on a device do not count; a child outlasting its parent counts to its
    parent's end."""
    events = [
        {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/host:CPU"}},
        {"ph": "M", "pid": 7, "name": "process_name", "args": {"name": "/device:GPU:0"}},
        _x(1, 1, "PjitFunction(step)", 0, 100),
        _x(1, 1, "command_buffer_12", 10, 60),
        _x(1, 1, "cuGraphLaunch (CudaGraph:3)", 20, 20),
        _x(1, 1, "command_buffer_7", 80, 10),
        _x(1, 1, "outside", 150, 5),
        _x(1, 2, "other thread", 10, 50),
        _x(7, 1, "kernel", 0, 100),
        # A second call whose child runs past its end: 20 µs of the call, 5 of them the child's.
        _x(1, 1, "PjitFunction(step)", 200, 20),
        _x(1, 1, "ParseArguments", 215, 30),
    ]
    total, times = host_trace.self_times(events)
    assert total == 120
    assert times == {
        "PjitFunction(step)": (30 + 15, 2),
        "command_buffer_N": (40 + 10, 2),
        "cuGraphLaunch (CudaGraph:N)": (20, 1),
        "ParseArguments": (5, 1),
    }
    got = host_trace.breakdown(events, steps=2, n=2)
    assert got == {"call_us_per_step": 60.0, "top": [
        {"name": "command_buffer_N", "us_per_step": 25.0, "count_per_step": 1.0},
        {"name": "PjitFunction(step)", "us_per_step": 22.5, "count_per_step": 1.0},
    ]}


def test_on_a_kept_trace_the_self_times_sum_to_the_calls_time():
    """On a real trace (the trainer's step at 64 images on one H200): the calls' time is
    `profile_trace.jit_calls`' (which counts each call once), every µs of it lands on exactly
    one event name, and XLA's 100 thunk executions a step are all inside the step's calls."""
    trace = KEPT / "gpu_decode_trace64_synthetic_1xH200.trace.json.gz"
    events = profile_trace.load_events(str(trace))
    steps = 10
    got = host_trace.breakdown(events, steps, n=None)
    calls = profile_trace.jit_calls(events, steps)["PjitFunction(step)"]
    assert got["call_us_per_step"] == pytest.approx(calls["us_per_step"], rel=1e-12)
    assert sum(r["us_per_step"] for r in got["top"]) == pytest.approx(got["call_us_per_step"],
                                                                      rel=1e-9)
    executes = sum(1 for e in events if e.get("name") == "command_buffer::execute")
    top = {r["name"]: r for r in got["top"]}
    assert top["command_buffer::execute"]["count_per_step"] == executes / steps


def test_the_command_line_prints_the_breakdown_of_a_trace(capsys):
    trace = KEPT / "gpu_decode_trace64_synthetic_1xH200.trace.json.gz"
    got = host_trace.main([str(trace), "--steps=10", "--top=3"])
    lines = capsys.readouterr().out.splitlines()
    total = f"{got['call_us_per_step']:,.0f}"
    assert lines[0] == f"host time in the calls: {total} µs a step; by self time:"
    assert len(lines) == 4 and lines[1].endswith("cuGraphLaunch (CudaGraph:N)")
