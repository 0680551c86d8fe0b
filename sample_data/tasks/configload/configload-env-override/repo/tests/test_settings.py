from settings import DEFAULTS, convert, load, parse


def test_parse():
    assert parse("a = 1\n# comment\n\nb=two") == {"a": "1", "b": "two"}


def test_convert():
    assert convert("8080") == 8080
    assert convert("True") is True
    assert convert("name") == "name"


def test_load_defaults():
    assert load("") == DEFAULTS
