import app


def test_new_name():
    assert app.count_items([1, 2]) == 2
