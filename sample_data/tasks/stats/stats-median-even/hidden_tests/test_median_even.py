from stats import median


def test_even_length():
    assert median([1, 2, 3, 4]) == 2.5
    assert median([1, 2]) == 1.5
    assert median([10, 0]) == 5
