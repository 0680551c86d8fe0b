from app import denied


def test_denied_text():
    assert denied("X") == 'Access denied for X'
