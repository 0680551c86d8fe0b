import pytest

from stats import mean, median, mode, variance


@pytest.mark.parametrize("fn", [mean, median, mode, variance])
def test_empty_data(fn):
    with pytest.raises(ValueError, match="empty data"):
        fn([])


def test_non_empty_still_works():
    assert mean([2]) == 2 and median([2]) == 2 and mode([2]) == 2 and variance([2]) == 0
