from app import take


def test_new_default():
    assert take(list(range(20))) == [0, 1, 2, 3, 4]


def test_explicit_value_still_wins():
    assert take(list(range(20)), 6) == [0, 1, 2, 3, 4, 5]
