from app import is_low


def test_boundary():
    assert is_low(19) is True
    assert is_low(20) is True
    assert is_low(21) is False
