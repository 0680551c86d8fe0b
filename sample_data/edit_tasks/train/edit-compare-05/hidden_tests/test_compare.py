from app import is_freezing


def test_boundary():
    assert is_freezing(-1) is True
    assert is_freezing(0) is True
    assert is_freezing(1) is False
