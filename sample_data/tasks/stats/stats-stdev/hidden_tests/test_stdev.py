import pytest

from stats import stdev


def test_population():
    assert stdev([2, 4, 4, 4, 5, 5, 7, 9]) == pytest.approx(2.0)


def test_sample():
    assert stdev([1, 2, 3, 4], sample=True) == pytest.approx(1.2909944)


def test_sample_needs_two():
    with pytest.raises(ValueError):
        stdev([1], sample=True)
