from app import minutes


def test_new_default():
    assert minutes(600) == 120


def test_explicit_value_still_wins():
    assert minutes(600, 6) == 100
