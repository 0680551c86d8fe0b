import app


def test_new_name():
    assert app.average([2, 4]) == 3.0
