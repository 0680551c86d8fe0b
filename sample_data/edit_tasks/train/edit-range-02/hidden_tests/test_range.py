from app import product


def test_includes_n():
    assert product(4) == 24
    assert product(1) == 1
