import app


def test_new_name():
    assert app.reverse("abc") == 'cba'
