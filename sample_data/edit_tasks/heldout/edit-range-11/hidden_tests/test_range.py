from app import sum_powers


def test_includes_n():
    assert sum_powers(4) == 30
    assert sum_powers(1) == 2
