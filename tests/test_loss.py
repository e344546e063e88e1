"""Tests for jia_jax.loss against numpy float64 references: ties, top-1/top-5, inf and NaN."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from jia_jax import loss

CLASSES = 10


def reference_topk(logits, labels, k):
    """Sorts each row (label first among equals) and looks for the label in the first k.

    A row with a NaN has no ranking: it scores 0.
    """
    out = []
    for row, label in zip(np.asarray(logits, np.float64), labels):
        if np.isnan(row).any():
            out.append(0.0)
            continue
        order = sorted(range(len(row)), key=lambda c: (-row[c], c != label))
        out.append(float(label in order[:k]))
    return np.array(out)


def reference_cross_entropy(logits, labels, smoothing):
    """-sum_c t_c log p_c in float64 over the classes with t_c > 0 (0 log 0 = 0)."""
    out = []
    for row, label in zip(np.asarray(logits, np.float64), labels):
        targets = np.full(len(row), smoothing / len(row))
        targets[label] += 1.0 - smoothing
        finite = row[np.isfinite(row)]
        shift = finite.max()
        log_z = shift + math.log(sum(math.exp(x - shift) for x in row))  # exp(-inf) = 0
        out.append(-sum(t * (x - log_z) for t, x in zip(targets, row) if t > 0))
    return np.array(out)


def random_case(seed, dtype):
    rng = np.random.default_rng(seed)
    logits = (3.0 * rng.standard_normal((64, CLASSES))).astype(dtype)
    labels = rng.integers(0, CLASSES, size=64)
    return logits, labels


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16])
def test_cross_entropy_matches_float64(smoothing, dtype):
    logits, labels = random_case(0, dtype)
    got = np.asarray(loss.cross_entropy(jnp.asarray(logits), jnp.asarray(labels), smoothing))
    assert got.dtype == np.float32
    # The reference sees the same (bf16-rounded) logits, so only the fp32 arithmetic differs:
    # |logits| <= ~13, so log Z <= ~16 and each fp32 log-probability is off by a few ulp of 16
    # (~4 * 16 * 2**-24 = 4e-6); the targets sum to 1, so the loss is off by as much.
    np.testing.assert_allclose(
        got, reference_cross_entropy(logits, labels, smoothing), rtol=0, atol=1e-5
    )


def test_cross_entropy_with_minus_inf_logits():
    # Class 3 impossible (logit -inf); the label is class 0 in both rows.
    logits = np.array([[1.0, 2.0, 0.5, -np.inf] + [0.0] * (CLASSES - 4)] * 2, np.float32)
    labels = np.array([0, 0])
    # Without smoothing the impossible class has target 0 and adds nothing: a finite loss.
    got = np.asarray(loss.cross_entropy(jnp.asarray(logits), jnp.asarray(labels), 0.0))
    want = reference_cross_entropy(logits, labels, 0.0)
    assert np.isfinite(want).all()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)  # as above, log Z <= ~3
    # With smoothing it has target 0.01 and log-probability -inf: the loss is +inf.
    got = np.asarray(loss.cross_entropy(jnp.asarray(logits), jnp.asarray(labels), 0.1))
    assert np.all(got == np.inf)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_cross_entropy_of_nan_or_plus_inf_logits_is_not_finite(bad):
    # What the divergence check looks for: such a loss must never read as a number.
    logits = np.zeros((2, CLASSES), np.float32)
    logits[0, 3] = bad
    logits[1, :] = bad
    got = np.asarray(loss.cross_entropy(jnp.asarray(logits), jnp.asarray([3, 0]), 0.1))
    assert not np.isfinite(got).any(), got


@pytest.mark.parametrize("k", [1, 5])
def test_topk_matches_sorting_with_ties(k):
    rng = np.random.default_rng(1)
    # Three distinct values over ten classes: most rows hold ties at the label's value.
    logits = rng.integers(0, 3, size=(256, CLASSES)).astype(np.float32)
    labels = rng.integers(0, CLASSES, size=256)
    got = np.asarray(loss.topk_correct(jnp.asarray(logits), jnp.asarray(labels), k))
    want = reference_topk(logits, labels, k)
    assert 0 < want.sum() < len(want)  # both outcomes occur
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("k", [1, 5])
def test_topk_matches_sorting_on_bf16(k):
    logits, labels = random_case(2, jnp.bfloat16)
    got = np.asarray(loss.topk_correct(jnp.asarray(logits), jnp.asarray(labels), k))
    np.testing.assert_array_equal(got, reference_topk(logits, labels, k))


@pytest.mark.parametrize("k", [1, 5])
def test_topk_with_inf_and_nan(k):
    base = np.arange(CLASSES, dtype=np.float32)  # class 9 first, class 0 last
    rows, labels = [], []

    def case(label, **values):
        row = base.copy()
        for index, value in values.items():
            row[int(index[1:])] = value
        rows.append(row)
        labels.append(label)

    case(0, c0=np.inf)  # the label alone at +inf: first
    case(0, c0=np.inf, c5=np.inf)  # tied at +inf: counts for the label
    case(9, c0=np.inf)  # one class above the label
    case(9, c9=-np.inf)  # the label at -inf: last
    case(9, c3=np.nan)  # the label is the largest finite logit, but the row holds a NaN
    case(4, c4=np.nan)  # the label's own logit is NaN
    rows.append(np.full(CLASSES, np.nan, np.float32))  # a diverged model's row
    labels.append(2)
    logits, labels = np.stack(rows), np.array(labels)
    got = np.asarray(loss.topk_correct(jnp.asarray(logits), jnp.asarray(labels), k))
    want = reference_topk(logits, labels, k)
    np.testing.assert_array_equal(got, want)
    # Spelled out, so that the reference itself is checked too: NaN rows score 0 at any k.
    expected = {1: [1, 1, 0, 0, 0, 0, 0], 5: [1, 1, 1, 0, 0, 0, 0]}[k]
    np.testing.assert_array_equal(got, expected)


def test_all_nan_logits_score_nothing():
    """Regression: a diverged model (all-NaN logits) scored 4 of 4 at top-1 and top-5."""
    logits = jnp.full((4, CLASSES), jnp.nan, jnp.float32)
    labels = jnp.array([0, 3, 7, 9])
    for k in (1, 5):
        assert float(jnp.sum(loss.topk_correct(logits, labels, k))) == 0.0
