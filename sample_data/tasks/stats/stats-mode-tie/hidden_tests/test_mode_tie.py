from stats import mode


def test_tie_takes_smallest():
    assert mode([1, 1, 2, 2]) == 1
    assert mode([5, 3, 5, 3, 9]) == 3


def test_clear_winner():
    assert mode([2, 7, 7]) == 7
