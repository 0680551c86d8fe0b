from app import evens


def test_includes_n():
    assert evens(4) == [2, 4, 6, 8]
    assert evens(1) == [2]
