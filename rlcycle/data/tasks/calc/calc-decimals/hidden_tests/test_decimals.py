from calc import evaluate, tokenize


def test_decimal_tokens():
    assert tokenize("1.5*2") == ["1.5", "*", "2"]


def test_decimal_arithmetic():
    assert evaluate("1.5 * 2") == 3
    assert evaluate("0.25 + 0.5") == 0.75
