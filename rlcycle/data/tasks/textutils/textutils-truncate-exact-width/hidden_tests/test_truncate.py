from textutils import truncate


def test_text_of_exactly_width_is_unchanged():
    assert truncate("hello", 5) == "hello"


def test_longer_text_is_cut_to_width():
    assert truncate("hello world", 8) == "hello..."
    assert len(truncate("abcdefghijkl", 6)) == 6
