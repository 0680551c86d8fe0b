from app import span


def test_returns_the_result():
    assert span([2, 9, 4]) == 7
