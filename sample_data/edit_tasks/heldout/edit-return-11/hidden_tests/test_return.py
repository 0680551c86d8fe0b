from app import dot


def test_returns_the_result():
    assert dot([1, 2], [3, 4]) == 11
