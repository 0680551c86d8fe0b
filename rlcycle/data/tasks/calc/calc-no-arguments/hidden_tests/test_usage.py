from calc import main


def test_no_arguments_prints_usage(capsys):
    assert main([]) == 2
    assert "usage: calc.py EXPRESSION" in capsys.readouterr().err


def test_with_arguments(capsys):
    assert main(["1", "+", "1"]) == 0
    assert capsys.readouterr().out == "2\n"
