from app import longest


def test_returns_the_result():
    assert longest(["a", "abc", "ab"]) == 'abc'
