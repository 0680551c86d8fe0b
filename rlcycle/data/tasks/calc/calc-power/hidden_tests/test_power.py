from calc import evaluate


def test_power():
    assert evaluate("2 ^ 10") == 1024


def test_right_associative():
    assert evaluate("2 ^ 3 ^ 2") == 512


def test_binds_tighter_than_multiplication():
    assert evaluate("2 * 3 ^ 2") == 18
    assert evaluate("3 ^ 2 * 2") == 18
    assert evaluate("1 + 2 ^ 2 - 1") == 4
