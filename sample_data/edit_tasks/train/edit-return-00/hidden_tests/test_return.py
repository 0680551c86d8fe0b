from app import without_none


def test_returns_the_result():
    assert without_none([1, None, 2]) == [1, 2]
