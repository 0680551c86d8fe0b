from app import pad


def test_new_default():
    assert pad("ab") == 'ab '


def test_explicit_value_still_wins():
    assert pad("ab", 4) == 'ab  '
