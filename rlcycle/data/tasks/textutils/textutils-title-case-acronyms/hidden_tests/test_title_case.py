from textutils import title_case


def test_acronyms_kept_when_asked():
    assert title_case("the NASA report", keep_acronyms=True) == "The NASA Report"
    assert title_case("a history OF the BBC", keep_acronyms=True) == "A History OF the BBC"


def test_default_is_unchanged():
    assert title_case("the NASA report") == "The Nasa Report"
    assert title_case("the lord of the rings") == "The Lord of the Rings"
