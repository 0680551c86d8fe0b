from app import backoff


def test_new_default():
    assert backoff(2) == 64


def test_explicit_value_still_wins():
    assert backoff(2, 7) == 49
