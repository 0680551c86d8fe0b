from app import goodbye


def test_goodbye_text():
    assert goodbye("X") == 'Goodbye, X'
