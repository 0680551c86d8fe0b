from calc import evaluate


def test_parentheses_override_precedence():
    assert evaluate("(2 + 3) * 4") == 20


def test_nested():
    assert evaluate("((1 + 2) * (3 + 4)) - 1") == 20
    assert evaluate("2 * (10 - (2 + 3))") == 10


def test_no_parentheses_unchanged():
    assert evaluate("2 + 3 * 4") == 14
