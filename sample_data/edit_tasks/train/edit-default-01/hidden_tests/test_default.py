from app import clamp


def test_new_default():
    assert clamp(7) == 3


def test_explicit_value_still_wins():
    assert clamp(7, 5) == 5
