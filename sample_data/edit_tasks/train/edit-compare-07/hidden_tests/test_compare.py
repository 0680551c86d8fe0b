from app import is_adult


def test_boundary():
    assert is_adult(17) is False
    assert is_adult(18) is True
    assert is_adult(19) is True
