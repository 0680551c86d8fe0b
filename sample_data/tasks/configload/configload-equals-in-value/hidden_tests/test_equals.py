from settings import load, parse


def test_value_with_equals():
    assert parse("query = a=b") == {"query": "a=b"}
    assert load("url = http://x/?a=1&b=2")["url"] == "http://x/?a=1&b=2"
