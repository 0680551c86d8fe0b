from stats import median


def test_unsorted_input():
    assert median([3, 1, 2]) == 2
    assert median([9, 2, 7, 4]) == 5.5


def test_input_not_modified():
    data = [3, 1, 2]
    median(data)
    assert data == [3, 1, 2]
