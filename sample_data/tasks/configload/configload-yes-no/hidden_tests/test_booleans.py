import pytest

from settings import convert


@pytest.mark.parametrize("text", ["yes", "YES", "on", "On", "true"])
def test_true_words(text):
    assert convert(text) is True


@pytest.mark.parametrize("text", ["no", "No", "off", "OFF", "false"])
def test_false_words(text):
    assert convert(text) is False


def test_others_unchanged():
    assert convert("maybe") == "maybe"
    assert convert("1") == 1
