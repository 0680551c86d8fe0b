import pytest

from stats import percentile


def test_median_point():
    assert percentile([1, 2, 3, 4], 50) == pytest.approx(2.5)


def test_ends():
    assert percentile([7, 1, 5], 0) == 1
    assert percentile([7, 1, 5], 100) == 7


def test_interpolation():
    assert percentile([10, 20, 30, 40, 50], 90) == pytest.approx(46.0)
    assert percentile([15, 20, 35, 40, 50], 40) == pytest.approx(29.0)


def test_bad_p():
    with pytest.raises(ValueError):
        percentile([1, 2], 101)
