import app


def test_new_name():
    assert app.celsius_to_fahrenheit(100) == 212.0
