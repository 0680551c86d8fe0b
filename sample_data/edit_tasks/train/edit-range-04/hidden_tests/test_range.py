from app import triangle


def test_includes_n():
    assert triangle(4) == 10
    assert triangle(1) == 1
