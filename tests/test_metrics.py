"""Tests for jia_jax.metrics: event files, lagged fetch, ETA, input wait and the non-finite loss
check."""

import dataclasses
import math
import struct

import jax
import jax.numpy as jnp
import pytest
from tensorboardX.proto import event_pb2

from jia_jax import metrics, stage_clock


def read_scalars(logdir):
    """Parses the TFRecord event files in `logdir` into {(tag, step): value}."""
    scalars = {}
    files = sorted(logdir.glob("events.out.tfevents.*"))
    for path in files:
        data = path.read_bytes()
        offset = 0
        while offset < len(data):
            # Record: uint64 length, uint32 length crc, payload, uint32 payload crc.
            (length,) = struct.unpack("<Q", data[offset : offset + 8])
            payload = data[offset + 12 : offset + 12 + length]
            offset += 12 + length + 4
            event = event_pb2.Event.FromString(payload)
            for value in event.summary.value:
                scalars[(value.tag, event.step)] = value.simple_value
    return files, scalars


def test_writer_writes_scalars_readable_as_events(tmp_path):
    written = {
        10: {"train/loss": 2.5, "train/lr": 0.1, "train/images_per_sec": 1234.5},
        20: {"train/loss": 1.25, "eval/top1": 0.75, "eval/top5": jnp.float32(0.9)},
    }
    with metrics.MetricsWriter(tmp_path, enabled=True) as writer:
        for step, scalars in written.items():
            writer.write_scalars(step, scalars)
    files, scalars = read_scalars(tmp_path)
    assert len(files) == 1
    expected = {(tag, step): float(v) for step, s in written.items() for tag, v in s.items()}
    assert scalars.keys() == expected.keys()
    for key, value in expected.items():
        # Event files store float32: relative error <= 2**-24.
        assert scalars[key] == pytest.approx(value, rel=1e-7), key


def test_disabled_writer_writes_nothing(tmp_path):
    with metrics.MetricsWriter(tmp_path, enabled=False) as writer:
        writer.write_scalars(1, {"train/loss": 1.0})
    assert not list(tmp_path.iterdir())


@jax.jit
def fake_step(step):
    return {"loss": 1.0 / (step + 1.0), "accuracy": step * 0.1}


def test_lagged_fetch_returns_step_t_after_step_t_plus_1():
    lagged = metrics.LaggedFetch()
    assert lagged.push(0, fake_step(0)) is None
    assert lagged.push(1, fake_step(1)) == (0, {"loss": 1.0, "accuracy": 0.0})
    # Step 2 is not wanted: pushing it still fetches step 1, and step 2 is never fetched.
    step, values = lagged.push(2, fake_step(2), fetch=False)
    assert step == 1 and values == pytest.approx({"loss": 0.5, "accuracy": 0.1}, rel=1e-6)
    assert lagged.push(3, fake_step(3)) is None
    [(step, values)] = lagged.flush()
    # float32 on device: relative error <= 1e-6.
    assert step == 3 and values == pytest.approx({"loss": 0.25, "accuracy": 0.3}, rel=1e-6)
    assert lagged.flush() == []


def test_lagged_fetch_with_lag_2_returns_step_t_after_step_t_plus_2():
    lagged = metrics.LaggedFetch(lag=2)
    assert lagged.push(0, fake_step(0)) is None
    assert lagged.push(1, fake_step(1)) is None
    assert lagged.push(2, fake_step(2)) == (0, {"loss": 1.0, "accuracy": 0.0})
    step, values = lagged.push(3, fake_step(3))
    assert step == 1 and values == pytest.approx({"loss": 0.5, "accuracy": 0.1}, rel=1e-6)
    # Both held steps come back at a flush, oldest first; none is held after.
    assert [step for step, _ in lagged.flush()] == [2, 3]
    assert lagged.push(4, fake_step(4)) is None


def test_lagged_fetch_refuses_lag_0():
    with pytest.raises(ValueError, match="lag must be >= 1"):
        metrics.LaggedFetch(lag=0)


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_loss_raises_with_step_and_hint(bad):
    lagged = metrics.LaggedFetch()
    lagged.push(41, {"loss": jnp.float32(bad)})
    with pytest.raises(metrics.NonFiniteLossError, match=r"step 41: loss = (nan|inf)") as info:
        lagged.push(42, {"loss": jnp.float32(1.0)})
    assert "learning_rate" in str(info.value)


def test_non_finite_check_can_be_disabled_for_fp16():
    lagged = metrics.LaggedFetch(finite_keys=())
    lagged.push(0, {"loss": jnp.float32(math.nan)})
    [(step, values)] = lagged.flush()
    assert step == 0 and math.isnan(values["loss"])


def test_eta_and_duration_arithmetic():
    assert metrics.eta_seconds(100, 1100, 2.0) == 500.0
    assert metrics.eta_seconds(1100, 1100, 2.0) == 0.0
    assert metrics.eta_seconds(5, 10, 0.0) == math.inf
    assert metrics.format_duration(3723) == "1:02:03"
    assert metrics.format_duration(86400 + 3661) == "1d 1:01:01"
    assert metrics.format_duration(math.inf) == "?"


def test_progress_meter_and_line_use_interval_rates():
    times = iter([100.0, 110.0, 115.0])
    meter = metrics.ProgressMeter(
        total_steps=1000, global_batch_size=256, start_step=0, clock=lambda: next(times)
    )
    meter.add_input_wait(1.0)
    meter.add_input_wait(1.5)  # summed: 2.5 s of the 10 s interval, exactly 0.25
    first = meter.measure(50)  # 50 steps in 10 s
    assert first == metrics.Throughput(5.0, 5.0 * 256, (1000 - 50) / 5.0, 0.25)
    # No wait since: the measure reset it (kept, it would read 2.5 / 5 = 0.5).
    second = meter.measure(100)  # 50 steps in 5 s
    assert second == metrics.Throughput(10.0, 10.0 * 256, (1000 - 100) / 10.0, 0.0)
    line = metrics.format_progress(50, 1000, {"loss": 2.34567, "lr": 0.1}, first)
    assert line == (
        "step   50/1000 | loss 2.346 | lr 0.1 | 1280.0 img/s | input wait 25% | ETA 0:03:10"
    )
    # Integer percent, rounded: 3.4% prints as 3%, 99.6% as 100%.
    for fraction, shown in ((0.034, "3%"), (0.996, "100%")):
        measured = dataclasses.replace(second, input_wait_fraction=fraction)
        line = metrics.format_progress(100, 1000, {}, measured)
        assert f"| 2560.0 img/s | input wait {shown} | ETA " in line, line


def test_progress_meter_means_the_launch_time_a_step_of_its_interval_only():
    times = iter([0.0, 10.0, 20.0, 30.0, 40.0])
    meter = metrics.ProgressMeter(
        total_steps=100, global_batch_size=8, start_step=0, clock=lambda: next(times)
    )
    meter.add_launch(0.5)  # before a restart: compilation, not training
    meter.restart(0)
    for seconds in (0.010, 0.014, 0.012, 0.004):
        meter.add_launch(seconds)
    # 40 ms over 4 calls: 10 ms a call (sums of a few binary fractions: within 1e-12).
    first = meter.measure(4)
    assert first.launch_ms == pytest.approx(10.0, abs=1e-12)
    assert "| launch 10.0 ms a step | ETA" in metrics.format_progress(4, 100, {}, first)
    # The last interval of a run holds fewer calls than steps (their metrics come late): the
    # mean is over the calls made, 3 ms, not 3 ms over its 6 steps.
    meter.add_launch(0.003)
    assert meter.measure(10).launch_ms == pytest.approx(3.0, abs=1e-12)
    # No call in an interval: no figure, and no field in the line.
    third = meter.measure(12)
    assert third.launch_ms is None
    assert "launch" not in metrics.format_progress(12, 100, {}, third)


def test_stage_clock_means_a_batch_and_starts_over():
    clock = stage_clock.StageClock()
    assert clock.take() == {}
    clock.add_batch({"read": 0.003, "decode": 0.020})
    clock.add_batch({"read": 0.001, "decode": 0.030})
    assert clock.take() == pytest.approx({"read": 2.0, "decode": 25.0})
    assert clock.take() == {}


def test_progress_meter_takes_the_input_stages_of_its_interval_only():
    times = iter([0.0, 10.0, 20.0, 30.0, 40.0])
    clock = stage_clock.StageClock()
    meter = metrics.ProgressMeter(
        total_steps=100, global_batch_size=8, start_step=0, clock=lambda: next(times),
        stages=clock,
    )
    clock.add_batch({"read": 0.004, "decode": 0.010})
    first = meter.measure(10)
    assert first.input_stages_ms == pytest.approx({"read": 4.0, "decode": 10.0})
    line = metrics.format_progress(10, 100, {}, first)
    assert "| input wait 0% (read 4, decode 10 ms a batch) | ETA" in line, line
    clock.add_batch({"read": 0.5, "decode": 0.5})  # before a restart: not training time
    meter.restart(10)
    clock.add_batch({"read": 0.002, "decode": 0.030})
    assert meter.measure(20).input_stages_ms == pytest.approx({"read": 2.0, "decode": 30.0})
    assert "input wait 0% | ETA" in metrics.format_progress(20, 100, {}, meter.measure(30))


def test_input_wait_is_zero_over_an_interval_of_no_time():
    times = iter([5.0, 5.0])
    meter = metrics.ProgressMeter(
        total_steps=10, global_batch_size=1, start_step=0, clock=lambda: next(times)
    )
    meter.add_input_wait(1.0)
    assert meter.measure(1) == metrics.Throughput(0.0, 0.0, math.inf, 0.0)


def test_progress_counts_only_training_time_after_a_restart():
    """A resumed run's first step compiles (and followed the restore): 60 s that are not
    training. Restarted after it, the next interval is 20 steps in 2 s, not in 62 s."""
    times = iter([0.0, 60.0, 62.0, 80.0, 81.0])
    meter = metrics.ProgressMeter(
        total_steps=1000, global_batch_size=10, start_step=500, clock=lambda: next(times)
    )
    meter.add_input_wait(30.0)  # the input pipeline's start, before the first step
    meter.restart(501)  # at 60 s: step 501 done, compiled
    meter.add_input_wait(0.5)
    assert meter.measure(501) is None  # nothing trained since the restart: no rate to show
    # The wait before the restart is gone (kept: 30.5 / 2 s = 15.25); the one after it, kept
    # through the measure that had no interval, is 0.5 of the 2 s.
    assert meter.measure(521) == metrics.Throughput(10.0, 100.0, (1000 - 521) / 10.0, 0.25)
    meter.add_input_wait(4.0)  # before the restart: dropped with the evaluation's 18 s
    meter.restart(521)  # at 80 s: after an evaluation of 18 s
    third = meter.measure(531)
    assert (third.steps_per_sec, third.input_wait_fraction) == (10.0, 0.0)  # 10 steps in 1 s
    line = metrics.format_progress(501, 1000, {"loss": 2.0}, None)
    assert line == "step  501/1000 | loss 2"


def test_non_finite_leaves_names_float_leaves_with_inf_or_nan():
    tree = {
        "params": {"w": jnp.ones((3, 4)), "b": jnp.array([0.0, jnp.nan])},
        "stats": (jnp.array([1.0, -jnp.inf], jnp.bfloat16), jnp.float32(-1e30)),
        "step": jnp.int32(7),  # integers cannot be non-finite and are skipped
    }
    assert metrics.non_finite_leaves(tree) == ["['params']['b']", "['stats'][0]"]
    assert metrics.non_finite_leaves({"w": jnp.full(4, 3.0e38), "n": jnp.int32(1)}) == []


def test_state_check_names_the_step_leaves_and_hint():
    finite = {"w": jnp.zeros(2)}
    metrics.check_state_finite(3, finite, "unused")
    state = {f"w{i}": jnp.full(2, jnp.nan) for i in range(7)}
    with pytest.raises(metrics.NonFiniteLossError) as info:
        metrics.check_state_finite(12, state, "Do X.")
    assert str(info.value) == (
        "Training diverged by step 12: the state holds inf or NaN in "
        "['w0'], ['w1'], ['w2'], ['w3'], ['w4'] and 2 more. Do X."
    )


def test_overflow_watch_counts_only_consecutive_skips_at_the_floor():
    watch = metrics.OverflowWatch(minimum=1.0, limit=3)
    # Skips above the floor, an applied step, and skips at the floor that are interrupted: none
    # of these is three skipped steps in a row at the floor.
    for step, skipped, scale in [(1, 1, 4.0), (2, 1, 2.0), (3, 1, 1.0), (4, 1, 1.0), (5, 0, 1.0)]:
        watch.update(step, {"skipped": skipped, "loss_scale": scale, "loss": 2.0})
    watch.update(6, {"loss": 2.0})  # bf16/fp32 metrics have no skip: never counted
    watch.update(7, {"skipped": 1.0, "loss_scale": 1.0})
    watch.update(8, {"skipped": 1.0, "loss_scale": 1.0})
    with pytest.raises(metrics.NonFiniteLossError, match="by step 9: its last 3 steps"):
        watch.update(9, {"skipped": 1.0, "loss_scale": 1.0})
