from calc import evaluate


def test_subtraction_is_left_associative():
    assert evaluate("8 - 3 - 2") == 3


def test_division_is_left_associative():
    assert evaluate("16 / 4 / 2") == 2


def test_mixed_levels():
    assert evaluate("10 - 2 * 3 + 1") == 5
