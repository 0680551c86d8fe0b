from app import tens


def test_includes_n():
    assert tens(4) == [10, 20, 30, 40]
    assert tens(1) == [10]
