from textutils import slugify


def test_digits_are_kept():
    assert slugify("Top 10 tips") == "top-10-tips"
    assert slugify("Python 3.12 release") == "python-3-12-release"


def test_letters_only_still_work():
    assert slugify("Hello, World!") == "hello-world"
