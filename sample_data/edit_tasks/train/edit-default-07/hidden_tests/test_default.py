from app import indent


def test_new_default():
    assert indent("x") == '    x'


def test_explicit_value_still_wins():
    assert indent("x", 8) == '        x'
