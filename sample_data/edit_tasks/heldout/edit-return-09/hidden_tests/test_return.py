from app import cents


def test_returns_the_result():
    assert cents(1.25) == 125
