import app


def test_new_name():
    assert app.cube(3) == 27
