"""`config.profile`: the trainer traces exactly the configured steps into the workdir."""

import argparse
import collections
import gzip
import json

import pytest

from jia_jax import loop
from tests.test_resume import OVERRIDES, configured


@pytest.mark.parametrize("python", [True, False])
def test_profile_traces_the_configured_steps_of_each_process(tmp_path, python):
    config = configured(
        {
            **OVERRIDES,
            "total_steps": 5,
            "checkpoint_every_steps": 100,
            "eval_every_steps": 1000,
            "profile.first_step": 1,
            "profile.steps": 2,
            "profile.python": python,
        }
    )
    loop.train_and_evaluate(config, str(tmp_path))
    [trace] = (tmp_path / "profile" / "process_0" / "plugins" / "profile").glob("*/*.trace.json.gz")
    events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    # One execution of the step program per traced step (on CPU, also one per device thread).
    executions = collections.Counter(
        e["name"]
        for e in events
        if e.get("name", "").startswith("CommonPjRtLoadedExecutable::Execute (jit_step)")
    )
    assert executions == {"CommonPjRtLoadedExecutable::Execute (jit_step)": 2}, executions
    # Python's tracer names each call "$<file>:<line> <function>".
    assert any(e.get("name", "").startswith("$") for e in events) == python


def test_profile_of_no_steps_is_refused(tmp_path):
    config = configured({**OVERRIDES, "profile.first_step": 1, "profile.steps": 0})
    with pytest.raises(ValueError, match="profile.steps=0 must be at least 1"):
        loop.train_and_evaluate(config, str(tmp_path))
    # Refused up front, with the other intervals: the workdir is not touched.
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("bench_first_step", [True, False])
def test_a_benchmarks_timed_lines_end_before_its_trace_starts(tmp_path, caplog, bench_first_step):
    # scripts.bench.hosts times the progress lines up to the trace's start (`loop.TRACE_STARTS`:
    # after it, the wait for the steps in flight, the start and the traced steps). Traced from
    # its `profile_first_step`, every timed step's line comes before that start; traced from the
    # step after the last timed one, the last timed line came after it (the second case).
    from scripts.bench import harness, hosts

    args = argparse.Namespace(steps=3, profile_steps=1)
    first = hosts.profile_first_step(args) if bench_first_step else args.steps + 1
    config = configured(
        {
            **OVERRIDES,
            "total_steps": args.steps + hosts.after_timed(args),
            "checkpoint_every_steps": 100,
            "eval_every_steps": 1000,
            "profile.first_step": first,
            "profile.steps": args.profile_steps,
            "profile.python": False,
        }
    )
    with caplog.at_level("INFO"):
        loop.train_and_evaluate(config, str(tmp_path))
    timed = [p["step"] for p in harness.trainer_progress(hosts.timed_lines(caplog.text))]
    assert loop.TRACE_STARTS in caplog.text
    assert timed and (timed[-1] == args.steps) == bench_first_step, timed
