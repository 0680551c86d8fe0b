from app import greeting


def test_greeting_text():
    assert greeting("X") == 'Hello, X!'
