import app


def test_new_name():
    assert app.extension("a/b/report.txt") == 'txt'
