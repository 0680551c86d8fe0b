from app import cells


def test_new_default():
    assert cells(3) == 6


def test_explicit_value_still_wins():
    assert cells(3, 9) == 27
