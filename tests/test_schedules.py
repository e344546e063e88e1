"""Learning-rate recipe vs numpy closed forms."""

import jax
import ml_collections
import numpy as np
import pytest

from jia_jax.schedules import (
    create_learning_rate_schedule,
    scaled_learning_rate,
    schedule_from_config,
    steps_per_epoch,
)

# Schedules return fp32: relative tolerance a few fp32 ulps.
RTOL = 1e-6


def closed_form(t, peak, total, warmup, decay, power, end):
    """float64 reference: linear warmup from 0, then poly/cosine decay; t an int array."""
    t = np.asarray(t, np.float64)
    p = np.clip((t - warmup) / (total - warmup), 0.0, 1.0)
    shape = (1.0 - p) ** power if decay == "poly" else 0.5 * (1.0 + np.cos(np.pi * p))
    after = end + (peak - end) * shape
    before = peak * t / warmup if warmup else after
    return np.where(t < warmup, before, after)


def test_scaled_learning_rate_and_steps_per_epoch():
    assert scaled_learning_rate(0.1, 8192) == pytest.approx(3.2)
    assert scaled_learning_rate(0.2, 512, base_batch=128) == pytest.approx(0.8)
    assert steps_per_epoch(1_281_167, 65_536) == pytest.approx(19.549, abs=1e-3)
    with pytest.raises(ValueError, match="global_batch_size"):
        steps_per_epoch(1000, 0)


@pytest.mark.parametrize(
    "decay,power,warmup,end",
    [("poly", 2.0, 10, 0.0), ("poly", 1.5, 0, 1e-4), ("cosine", 2.0, 7, 0.01)],
)
def test_schedule_matches_closed_form(decay, power, warmup, end):
    peak, total = 2.5, 50
    sched = jax.jit(create_learning_rate_schedule(peak, total, warmup, decay, power, end))
    t = np.arange(total + 5)  # past the end it stays at end_lr
    got = np.array([sched(i) for i in t])
    np.testing.assert_allclose(
        got, closed_form(t, peak, total, warmup, decay, power, end), rtol=RTOL, atol=1e-7
    )
    assert got[0] == (0.0 if warmup else peak)
    assert got[warmup] == pytest.approx(peak, rel=RTOL)
    assert got[-1] == pytest.approx(end, abs=1e-7)


def _cfg(**overrides):
    cfg = ml_collections.ConfigDict(
        dict(learning_rate=23.0, warmup_epochs=2.0, decay="poly", power=2.0, end_learning_rate=1e-4)
    )
    cfg.update(overrides)
    return cfg


def test_schedule_from_config_converts_warmup_epochs():
    # 1000 examples at batch 64: 15.625 steps an epoch, 2 epochs -> round(31.25) = 31 steps.
    sched = schedule_from_config(_cfg(), num_train_examples=1000, global_batch=64, total_steps=100)
    t = np.arange(100)
    want = closed_form(t, 23.0, 100, 31, "poly", 2.0, 1e-4)
    np.testing.assert_allclose([sched(i) for i in t], want, rtol=RTOL, atol=1e-6)


@pytest.mark.parametrize(
    "overrides,total,field",
    [
        ({"warmup_epochs": 7.0}, 100, "optimizer.warmup_epochs"),  # 109 warmup steps >= 100
        ({"warmup_epochs": -1.0}, 100, "optimizer.warmup_epochs"),
        ({"decay": "step"}, 100, "optimizer.decay"),
        ({"learning_rate": 0.0}, 100, "optimizer.learning_rate"),
        ({"end_learning_rate": -1e-4}, 100, "optimizer.end_learning_rate"),
        ({"power": 0.0}, 100, "optimizer.power"),
        ({}, 0, "total_steps"),
    ],
)
def test_bad_config_names_the_field(overrides, total, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        schedule_from_config(
            _cfg(**overrides), num_train_examples=1000, global_batch=64, total_steps=total
        )
