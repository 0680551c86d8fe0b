import app


def test_new_name():
    assert app.username("ada@example.org") == 'ada'
