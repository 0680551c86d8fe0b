from app import passed


def test_boundary():
    assert passed(49) is False
    assert passed(50) is True
    assert passed(51) is True
