import app


def test_new_name():
    assert app.basename("a/b/report.txt") == 'report.txt'
