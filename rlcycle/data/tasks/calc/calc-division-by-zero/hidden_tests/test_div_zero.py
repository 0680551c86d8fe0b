from calc import main


def test_division_by_zero_is_reported(capsys):
    assert main(["1", "/", "0"]) == 1
    captured = capsys.readouterr()
    assert "error: division by zero" in captured.err
    assert captured.out == ""


def test_normal_division(capsys):
    assert main(["9", "/", "3"]) == 0
    assert capsys.readouterr().out == "3\n"
