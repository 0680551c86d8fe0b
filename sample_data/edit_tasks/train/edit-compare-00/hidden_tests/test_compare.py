from app import is_full


def test_boundary():
    assert is_full(99) is False
    assert is_full(100) is True
    assert is_full(101) is True
