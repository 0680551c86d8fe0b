import app


def test_new_name():
    assert app.make_tag("Ada Lovelace") == '#ada lovelace'
