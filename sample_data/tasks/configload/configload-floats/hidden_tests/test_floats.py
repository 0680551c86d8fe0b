from settings import convert, load


def test_floats():
    assert convert("0.5") == 0.5
    assert isinstance(convert("0.5"), float)
    assert convert("1e3") == 1000.0


def test_ints_stay_ints():
    assert convert("42") == 42
    assert isinstance(convert("42"), int)


def test_load_converts_floats():
    assert load("ratio = 0.25")["ratio"] == 0.25
