from app import is_overdue


def test_boundary():
    assert is_overdue(29) is False
    assert is_overdue(30) is False
    assert is_overdue(31) is True
