from app import failure


def test_failure_text():
    assert failure("X") == 'Error: cannot open X'
