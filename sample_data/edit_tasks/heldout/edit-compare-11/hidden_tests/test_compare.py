from app import has_room


def test_boundary():
    assert has_room(9) is True
    assert has_room(10) is False
    assert has_room(11) is False
