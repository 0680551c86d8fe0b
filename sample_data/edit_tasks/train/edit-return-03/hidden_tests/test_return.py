from app import to_seconds


def test_returns_the_result():
    assert to_seconds(1, 30) == 5400
