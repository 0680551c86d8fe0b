import pytest

from stats import sample_variance, variance


def test_sample_variance():
    assert sample_variance([2, 4, 4, 4, 5, 5, 7, 9]) == pytest.approx(32 / 7)


def test_population_variance_unchanged():
    assert variance([2, 4, 4, 4, 5, 5, 7, 9]) == pytest.approx(4.0)


def test_needs_two_values():
    with pytest.raises(ValueError):
        sample_variance([3])
