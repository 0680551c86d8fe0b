from settings import parse


def test_indented_comments_are_ignored():
    assert parse("a = 1\n    # note\n\t# tabbed = comment\nb = 2") == {"a": "1", "b": "2"}
