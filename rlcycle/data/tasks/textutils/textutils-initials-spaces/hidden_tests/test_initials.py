from textutils import initials


def test_extra_spaces_are_ignored():
    assert initials("Ada  Lovelace") == "A.L."
    assert initials(" Grace Hopper ") == "G.H."


def test_empty_name_has_no_initials():
    assert initials("") == ""
