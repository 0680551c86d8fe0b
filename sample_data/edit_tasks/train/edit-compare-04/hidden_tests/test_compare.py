from app import is_top


def test_boundary():
    assert is_top(2) is True
    assert is_top(3) is True
    assert is_top(4) is False
