"""The bundled digits: read from scikit-learn's data file, without importing scikit-learn, as
scikit-learn's own reader gives them."""

import importlib.util
import subprocess
import sys

import numpy as np
import pytest
from sklearn.datasets import load_digits

from jia_jax import input_pipeline


def _assert_as_load_digits(images: np.ndarray, labels: np.ndarray) -> None:
    digits = load_digits()
    assert images.dtype == digits.images.dtype and labels.dtype == digits.target.dtype
    np.testing.assert_array_equal(images, digits.images)
    np.testing.assert_array_equal(labels, digits.target)
    assert images.shape == (1797, 8, 8) and set(np.unique(labels)) == set(range(10))


def test_bundled_digits_are_load_digits_to_the_bit():
    _assert_as_load_digits(*input_pipeline.bundled_digits())


def test_without_the_data_file_scikit_learns_reader_gives_the_same(monkeypatch):
    input_pipeline.bundled_digits.cache_clear()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    try:
        _assert_as_load_digits(*input_pipeline.bundled_digits())
    finally:
        input_pipeline.bundled_digits.cache_clear()


def test_the_shared_arrays_cannot_be_changed_by_a_caller():
    images, labels = input_pipeline.bundled_digits()
    with pytest.raises(ValueError, match="read-only"):
        images[0, 0, 0] = 1.0
    with pytest.raises(ValueError, match="read-only"):
        labels[0] = 1


def test_loading_the_digits_splits_imports_no_scikit_learn():
    # Importing scikit-learn (and SciPy) would add seconds to every digits run's start-up.
    code = (
        "import sys\n"
        "from jia_jax import input_pipeline\n"
        "x, y = input_pipeline.digits_split('train', 8)\n"
        "assert x.shape == (1437, 8, 8, 1) and y.shape == (1437,), (x.shape, y.shape)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sklearn', 'scipy')))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]"
