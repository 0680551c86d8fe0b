from textutils import word_count


def test_empty_text_has_no_words():
    assert word_count("") == 0


def test_runs_of_whitespace_are_one_separator():
    assert word_count("a  b") == 2
    assert word_count(" one\ttwo\nthree ") == 3
