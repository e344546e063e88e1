"""The bench's step trained in a thread (scripts/bench/step_thread.py), on CPU."""

import argparse
import gzip
import json
import threading
import time

import jax
import pytest

from scripts.bench import profile_trace, step_thread


def test_a_failed_training_thread_is_raised_by_the_next_pause(monkeypatch):
    """A step that fails in the training thread makes the next pause raise with its error,
    instead of waiting for the thread forever."""
    from jia_jax import train

    make = train.make_train_step
    calls = []

    def failing(*args, **kwargs):
        step = make(*args, **kwargs)

        def counted(state, batch):
            calls.append(1)
            if len(calls) > 3:  # the compile's call and two steps run
                raise ValueError("the step broke")
            return step(state, batch)
        return counted

    monkeypatch.setattr(train, "make_train_step", failing)
    args = argparse.Namespace(tiny_model=True, train_model="alexnet_bn",
                              train_compute_dtype="float32")
    with step_thread.training(jax.devices()[0], 4, args) as times:
        times.run(True)
        while len(calls) <= 3:
            time.sleep(0.01)
        raised = []

        def pause() -> None:
            try:
                times.run(False)
            except RuntimeError as e:
                raised.append(e)

        pausing = threading.Thread(target=pause, daemon=True)
        pausing.start()
        pausing.join(timeout=60)  # without the error kept, the pause waited forever
        assert not pausing.is_alive()
    assert len(raised) == 1 and "training thread failed" in str(raised[0])
    assert isinstance(raised[0].__cause__, ValueError) and len(times) == 2


def test_traced_boundaries_are_per_traced_step(tmp_path):
    """The boundaries of the first GPU's busiest stream in a trace file's kernels, per step
    given."""
    run = tmp_path / "plugins" / "profile" / "r"
    run.mkdir(parents=True)
    meta = [{"ph": "M", "pid": 7, "name": "process_name", "args": {"name": "/device:GPU:0"}},
            {"ph": "M", "pid": 7, "tid": 1, "name": "thread_name",
             "args": {"name": "Stream #14(Compute)"}}]
    # 9 kernels of 10 µs, each 0.5 µs after the one before: 8 boundaries.
    kernels = [{"ph": "X", "pid": 7, "tid": 1, "name": f"fusion_{i}", "ts": 10.5 * i, "dur": 10}
               for i in range(9)]
    with gzip.open(run / "h.trace.json.gz", "wt") as f:
        json.dump({"traceEvents": meta + kernels}, f)
    kernels = profile_trace.load_kernels(str(tmp_path))
    got = step_thread.traced_boundaries(kernels, steps=2)
    assert got["count_per_step"] == 4 and got["sum_us_per_step"] == pytest.approx(2.0)
    assert got["p50_us"] == pytest.approx(0.5)
    assert step_thread.traced_boundaries(kernels, steps=0) is None
