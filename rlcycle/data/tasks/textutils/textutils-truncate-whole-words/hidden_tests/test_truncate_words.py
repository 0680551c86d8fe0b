from textutils import truncate


def test_word_at_the_cut_is_kept_whole():
    assert truncate("hello wonderful world", 10) == "hello wonderful..."


def test_cut_at_a_space_is_unchanged():
    assert truncate("hello world again", 8) == "hello..."


def test_fitting_text_unchanged():
    assert truncate("short", 10) == "short"
