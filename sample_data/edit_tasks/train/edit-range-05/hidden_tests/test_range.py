from app import sum_halves


def test_includes_n():
    assert sum_halves(4) == 5.0
    assert sum_halves(1) == 0.5
