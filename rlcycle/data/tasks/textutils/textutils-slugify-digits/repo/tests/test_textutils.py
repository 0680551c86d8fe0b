from textutils import initials, slugify, title_case, truncate, word_count


def test_slugify():
    assert slugify("Hello, World!") == "hello-world"


def test_truncate_short_text_unchanged():
    assert truncate("hi", 10) == "hi"


def test_word_count():
    assert word_count("one two three") == 3


def test_title_case():
    assert title_case("the lord of the rings") == "The Lord of the Rings"


def test_initials():
    assert initials("Ada Lovelace") == "A.L."
