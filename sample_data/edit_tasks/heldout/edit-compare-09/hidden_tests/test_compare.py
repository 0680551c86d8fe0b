from app import is_speeding


def test_boundary():
    assert is_speeding(49) is False
    assert is_speeding(50) is False
    assert is_speeding(51) is True
