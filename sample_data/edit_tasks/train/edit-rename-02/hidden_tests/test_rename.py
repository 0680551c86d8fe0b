import app


def test_new_name():
    assert app.initials("Ada Lovelace") == 'AL'
