from calc import evaluate, main, tokenize


def test_tokenize():
    assert tokenize("2+3*4") == ["2", "+", "3", "*", "4"]


def test_precedence():
    assert evaluate("2 + 3 * 4") == 14


def test_main_prints_integers_plainly(capsys):
    assert main(["6", "*", "7"]) == 0
    assert capsys.readouterr().out == "42\n"
