from app import numbers


def test_includes_n():
    assert numbers(4) == [1, 2, 3, 4]
    assert numbers(1) == [1]
