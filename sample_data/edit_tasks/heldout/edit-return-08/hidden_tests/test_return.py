from app import km_to_miles


def test_returns_the_result():
    assert km_to_miles(10) == 6.21
