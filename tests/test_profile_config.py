"""`config.profile`: the trainer traces exactly the configured steps into the workdir."""

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
