from app import thanks


def test_thanks_text():
    assert thanks("X") == 'Thanks for your order, X'
