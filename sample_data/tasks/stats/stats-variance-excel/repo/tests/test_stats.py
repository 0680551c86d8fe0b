from stats import mean, median, mode, variance


def test_mean():
    assert mean([1, 2, 3, 6]) == 3


def test_median_odd():
    assert median([1, 3, 5]) == 3


def test_mode():
    assert mode([4, 4, 1]) == 4


def test_variance():
    assert variance([2, 4, 4, 4, 5, 5, 7, 9]) == 4
