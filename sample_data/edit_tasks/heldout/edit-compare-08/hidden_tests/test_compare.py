from app import has_quorum


def test_boundary():
    assert has_quorum(11) is False
    assert has_quorum(12) is True
    assert has_quorum(13) is True
