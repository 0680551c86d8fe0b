from app import sum_squares


def test_includes_n():
    assert sum_squares(4) == 30
    assert sum_squares(1) == 1
