import app


def test_new_name():
    assert app.compute_total([1, 2, 3]) == 6
