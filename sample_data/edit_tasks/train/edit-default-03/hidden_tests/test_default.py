from app import shift


def test_new_default():
    assert shift(7) == 9


def test_explicit_value_still_wins():
    assert shift(7, 9) == 16
