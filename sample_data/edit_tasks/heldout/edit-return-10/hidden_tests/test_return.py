from app import rectangle_area


def test_returns_the_result():
    assert rectangle_area(3, 4) == 12
