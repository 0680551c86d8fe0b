from app import needs_reorder


def test_boundary():
    assert needs_reorder(4) is True
    assert needs_reorder(5) is True
    assert needs_reorder(6) is False
