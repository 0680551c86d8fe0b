from app import connect


def test_new_default():
    assert connect("db") == 'db:9'


def test_explicit_value_still_wins():
    assert connect("db", 8) == 'db:8'
