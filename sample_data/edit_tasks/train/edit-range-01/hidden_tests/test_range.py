from app import total


def test_includes_n():
    assert total(4) == 10
    assert total(1) == 1
