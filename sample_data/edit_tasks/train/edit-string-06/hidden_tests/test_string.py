from app import welcome


def test_welcome_text():
    assert welcome("X") == 'Welcome back, X'
