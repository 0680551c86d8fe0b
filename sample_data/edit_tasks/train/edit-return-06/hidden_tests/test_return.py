from app import discounted


def test_returns_the_result():
    assert discounted(200, 10) == 180.0
