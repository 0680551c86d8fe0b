from app import page_count


def test_new_default():
    assert page_count(95) == 32


def test_explicit_value_still_wins():
    assert page_count(95, 4) == 24
