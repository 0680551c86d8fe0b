from app import mean


def test_returns_the_result():
    assert mean([2, 9, 4]) == 5.0
