import app


def test_new_name():
    assert app.square(3) == 9
