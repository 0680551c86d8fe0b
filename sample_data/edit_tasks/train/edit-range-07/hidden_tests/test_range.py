from app import sum_cubes


def test_includes_n():
    assert sum_cubes(4) == 100
    assert sum_cubes(1) == 1
