from app import closed


def test_closed_text():
    assert closed("X") == 'X is closed today'
