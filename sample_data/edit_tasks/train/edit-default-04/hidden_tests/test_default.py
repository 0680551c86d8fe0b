from app import with_tax


def test_new_default():
    assert with_tax(200) == 214


def test_explicit_value_still_wins():
    assert with_tax(200, 6) == 212
