from app import repeat


def test_new_default():
    assert repeat("ha") == 'hahahahahahahahaha'


def test_explicit_value_still_wins():
    assert repeat("ha", 7) == 'hahahahahahaha'
