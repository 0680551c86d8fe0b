from app import odds


def test_includes_n():
    assert odds(4) == [1, 3, 5, 7]
    assert odds(1) == [1]
