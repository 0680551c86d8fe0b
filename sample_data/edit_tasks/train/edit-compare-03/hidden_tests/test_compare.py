from app import is_boiling


def test_boundary():
    assert is_boiling(99) is False
    assert is_boiling(100) is True
    assert is_boiling(101) is True
