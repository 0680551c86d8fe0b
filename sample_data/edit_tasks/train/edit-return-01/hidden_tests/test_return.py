from app import shout


def test_returns_the_result():
    assert shout("hi") == 'HI!'
