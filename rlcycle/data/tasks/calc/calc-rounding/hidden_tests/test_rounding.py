from calc import evaluate, main


def run(capsys, *args):
    assert main(list(args)) == 0
    return capsys.readouterr().out


def test_printed_results_are_rounded(capsys):
    assert run(capsys, "10", "/", "3") == "3.33\n"
    assert run(capsys, "2", "/", "3") == "0.67\n"


def test_trailing_zeros_dropped(capsys):
    assert run(capsys, "10", "/", "4") == "2.5\n"
    assert run(capsys, "4", "/", "2") == "2\n"


def test_evaluate_is_exact():
    assert evaluate("10 / 3") == 10 / 3
