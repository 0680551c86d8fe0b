from app import warn


def test_warn_text():
    assert warn("X") == 'Warning: X is low'
